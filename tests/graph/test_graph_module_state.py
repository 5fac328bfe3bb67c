"""nn.Graph replays and the state modules keep outside autograd (a probe of OneFlow-style code):
BatchNorm's running statistics (both momentum kinds) and Embedding's max_norm renormalisation
are written by array code the tape now records, so every replay updates them as eager does; a
parameter reassigned after a trace is read by a new trace; OneFlow's Graph.state_dict is refused
by name."""
import numpy as np
import pytest

import engine as flow
from engine import nn


def _bn_run(momentum, graph):
    flow.manual_seed(0)
    bn = nn.BatchNorm1d(3, momentum=momentum)

    class G(nn.Graph):
        def __init__(self):
            super().__init__()
            self.bn = bn

        def build(self, x):
            return self.bn(x)

    step = G() if graph else bn
    rng = np.random.default_rng(0)
    for i in range(4):
        step(flow.tensor(rng.standard_normal((5, 3)).astype(np.float32) + i))
    return bn.running_mean.numpy().copy(), bn.running_var.numpy().copy(), int(bn.num_batches_tracked.item())


@pytest.mark.parametrize("momentum", [0.1, None])
def test_batch_norm_running_statistics_update_on_every_replay(momentum):
    eager, graph = _bn_run(momentum, False), _bn_run(momentum, True)
    for e, g in zip(eager, graph):
        np.testing.assert_array_equal(g, e)


def test_embedding_max_norm_renormalises_on_every_replay():
    def run(graph):
        flow.manual_seed(0)
        emb = nn.Embedding(6, 4, max_norm=1.0)
        with flow.no_grad():
            emb.weight.mul_(5.0)

        class G(nn.Graph):
            def __init__(self):
                super().__init__()
                self.emb = emb

            def build(self, ids):
                return self.emb(ids)

        step = G() if graph else emb
        outs = [step(flow.tensor(ids)).detach().numpy() for ids in ([0, 1], [2, 3], [0, 4])]
        return outs, emb.weight.detach().numpy()

    (eager_outs, eager_w), (graph_outs, graph_w) = run(False), run(True)
    for e, g in zip(eager_outs, graph_outs):
        np.testing.assert_array_equal(g, e)
    np.testing.assert_array_equal(graph_w, eager_w)
    assert np.allclose(np.linalg.norm(graph_w[:5], axis=1), 1.0, atol=1e-6)


def test_a_reassigned_parameter_is_traced_again():
    m = nn.Linear(4, 2)

    class G(nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m

        def build(self, x):
            return self.m(x).sum()

    g, x = G(), flow.ones(3, 4)
    g(x)
    m.weight = nn.Parameter(flow.ones(2, 4))
    assert float(g(x)) == pytest.approx(float(m(x).sum().detach()))
    assert g.num_traces == 2


def test_graph_state_dict_and_a_0_dim_input_under_accumulation_are_named():
    class G(nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = nn.Linear(2, 2)
            self.config.set_gradient_accumulation_steps(2)

        def build(self, x, s):
            return self.m(x).sum() * s

    g = G()
    with pytest.raises(NotImplementedError, match="save its modules' and optimizers' state_dict"):
        g.state_dict()
    with pytest.raises(ValueError, match="0-dim tensor, which has no rows"):
        g(flow.ones(4, 2), flow.tensor(2.0))
