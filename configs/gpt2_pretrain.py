"""Recipe: pretrain a small GPT-2 (4 layers, hidden 256, 4 heads, 128 tokens) on CPU.

    python tools/train_net.py --config-file configs/gpt2_pretrain.py [key=value ...]

With no data configured it trains on the embedded default corpus (Python's documentation,
tokenized with a BPE trained on it; built once and cached, nothing downloaded) and takes a few
minutes on a laptop CPU. Perplexity (PPLEvaluator) is measured on the valid split (`PPL`, which
picks model_best) and, when the corpus is big enough for a test split, on it (`test/PPL`); logs,
metrics.json, TensorBoard events and checkpoints land in output/gpt2_pretrain/.

Your own corpus, bigger models, dp/tp layouts and generation: docs/gpt2.md. E.g. 4 processes,
2-way data x 2-way tensor parallel:

    python -m engine.distributed.launch --nproc-per-node 4 tools/train_net.py \
        --config-file configs/gpt2_pretrain.py \
        train.dist.data_parallel_size=2 train.dist.tensor_parallel_size=2
"""
from libai.config import LazyCall, get_config
from libai.evaluation import PPLEvaluator

model = get_config("common/models/gpt.py").model
_data = get_config("common/data/gpt_dataset.py")
tokenization, dataloader = _data.tokenization, _data.dataloader
optim = get_config("common/optim.py").optim
train = get_config("common/train.py").train

# ---- model: vocab_size is replaced by the tokenizer's padded size when training starts
model.cfg.update(
    hidden_layers=4,
    hidden_size=256,
    ffn_hidden_size=1024,
    num_attention_heads=4,
    max_seq_length=128,
    embedding_dropout_prob=0.1,
    attention_dropout_prob=0.1,
    output_dropout_prob=0.1,
)

# ---- data: default corpus (paths None); each sample is max_seq_length tokens
for _ds in dataloader.train.dataset:  # '_': not a config key
    _ds.seq_length = "${model.cfg.max_seq_length}"  # follows model.cfg.max_seq_length overrides
dataloader.train.splits = [[949.0, 50.0, 1.0]]

optim.lr = 1e-3
optim.weight_decay = 0.01

train.update(
    output_dir="./output/gpt2_pretrain",
    train_micro_batch_size=8,
    global_batch_size=None,
    num_accumulation_steps=None,
    test_micro_batch_size=8,
    train_iter=200,
    warmup_ratio=0.05,
    log_period=10,
    input_placement_device="cpu",
    seed=1234,
)
train.checkpointer.update(period=100, max_to_keep=2)
train.evaluation.update(
    enabled=True,
    evaluator=LazyCall(PPLEvaluator)(),
    eval_period=100,
    eval_iter=10,
    eval_metric="PPL",  # the valid split's perplexity (the test split's is "test/PPL")
    eval_mode="min",
)
