import pytest

from gpt_hf_helpers import make_hf_gpt2


@pytest.fixture(scope="module")
def hf_gpt2(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf_gpt2")
    model = make_hf_gpt2(path)
    return str(path), model


@pytest.fixture(autouse=True)
def _fresh_dist_util():
    from libai.utils import distributed as dist

    dist._reset_dist_util()
    yield
    dist._reset_dist_util()
