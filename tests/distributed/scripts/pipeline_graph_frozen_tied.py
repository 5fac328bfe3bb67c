"""pp=2 on 2 ranks, GPT-2 with its word embedding (tied to the LM head on the last stage) frozen:
the runner neither fetches a gradient for the frozen weight nor adds one to it, eagerly and as a
PipelineGraph (traced, then replayed twice), and the other gradients of both modes agree bit for
bit. A graph scaler is refused; a replay after one that failed between its sends and its wait
is refused."""
import numpy as np

import engine as flow
from engine.autograd.trace import GraphTraceError
from engine.distributed import pipeline as handoff
from libai.data.structures import DistTensorData
from libai.engine.pipeline import PipelineGraph, PipelineRunner
from libai.models import GPTForPreTraining
from libai.utils import distributed as dist

dist.setup_dist_util({"data_parallel_size": 1, "tensor_parallel_size": 1, "pipeline_parallel_size": 2,
                      "pipeline_num_layers": 2})
flow.manual_seed(0)
model = GPTForPreTraining(hidden_layers=2, vocab_size=128, hidden_size=32, num_attention_heads=4, max_seq_length=16,
                          embedding_dropout_prob=0.0, attention_dropout_prob=0.0, output_dropout_prob=0.0)
embedding = model.GPT_model.embeddings.token_embeddings.weight
embedding.requires_grad_(False)
rng = np.random.default_rng(0)
data = [{k: rng.integers(0, 128, (4, 16)).astype(np.int64) for k in ("input_ids", "labels")} for _ in range(2)]


def get_batch(batch, placement):
    out = {}
    for k, v in batch.items():
        d = DistTensorData(flow.tensor(v))
        d.to_global(placement=placement)
        out[k] = d.tensor
    return out


runner = PipelineRunner(model, get_batch)
params = [p for p in model.parameters() if p.placement == runner.here and p.requires_grad]


def grads():
    out = [p.grad.to_local().numpy().copy() for p in params]
    for p in params:
        p.grad = None
    return out


feed = iter(data)
logged, _ = runner.run(lambda: next(feed), 2)
eager = grads()
assert embedding.grad is None
graph = PipelineGraph(runner)
for _ in range(3):
    outputs = graph([get_batch(b, runner.here) for b in data])
    got = grads()
    assert all(np.array_equal(a, b) for a, b in zip(got, eager)), "graph gradients differ from eager"
    assert embedding.grad is None
    if runner.is_last:
        assert [{k: v.item() for k, v in o.items()} for o in outputs] == logged
assert graph.num_traces == 1
try:  # the stages' backwards start from received (already scaled) gradients
    graph.set_grad_scaler(flow.amp.GradScaler())
except NotImplementedError as e:
    assert "scale_loss" in str(e)
else:
    raise AssertionError("PipelineGraph.set_grad_scaler was accepted")

# a replay that failed after its sends: the next schedule refuses to start
handoff._replayed_sends.extend([object(), object()])  # what a failed replay leaves: its unwaited requests
try:
    handoff.begin()
except GraphTraceError as e:
    assert "out of step" in str(e)
else:
    raise AssertionError("begin() after a failed replay did not raise")
print("frozen tied pipeline graph ok")
