"""Every rank must run the same config (libai.engine.default.check_same_config_on_every_rank).

A config that reads the environment can differ between ranks. A different checkpoint period
made one rank wait in a save's collective while the other trained on (a hang); a different
seed or learning rate trained each rank differently without a word. The setup now compares
the resolved configs and stops every rank, naming the keys and each rank's value."""
import os
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "gpt2"))

from gpt2_helpers import CONFIG, TINY, train_net  # noqa: E402


def test_ranks_with_different_configs_stop_naming_the_keys(tmp_path):
    cfg = tmp_path / "per_rank.py"
    cfg.write_text(textwrap.dedent(f"""
        import os
        from libai.config import LazyConfig
        _c = LazyConfig.load({CONFIG!r})
        model, tokenization, dataloader, optim, train = _c.model, _c.tokenization, _c.dataloader, _c.optim, _c.train
        if os.environ.get("RANK") == "1":
            train.checkpointer.period = 3
            optim.lr = 0.01
    """))
    rc, out, err = train_net(f"train.output_dir={tmp_path / 'out'}", *TINY, "train.train_iter=6",
                             "train.evaluation.enabled=False", "tokenization.make_vocab_size_divisible_by=256",
                             "train.dist.data_parallel_size=2", nprocs=2, config=str(cfg), check=False, timeout=120)
    assert rc != 0
    text = out + err
    assert "the ranks were given different configs (2 keys differ)" in text, text[-3000:]
    assert "optim.lr: rank 0: 0.001, rank 1: 0.01" in text
    assert "train.checkpointer.period: rank 0: 100, rank 1: 3" in text


def test_the_compared_text_of_a_config_does_not_depend_on_the_process():
    """A set's order follows the process's hash seed and an object's repr its address: ranks with
    the same config must compare equal (a config holding a set was refused without a fixed
    PYTHONHASHSEED, which the launcher does not set)."""
    import subprocess

    code = textwrap.dedent("""
        import sys; sys.path.insert(0, {root!r})
        from omegaconf import DictConfig
        from libai.engine.default import _flat_config
        cfg = DictConfig({{"train": {{"keys": {{"lm_head.weight", "cls.bias", "pooler.dense.bias", "position_ids"}},
                                     "fn": object()}}}}, flags={{"allow_objects": True}})
        print(sorted(_flat_config(cfg).items()))
    """).format(root=os.path.dirname(os.path.dirname(HERE)))
    texts = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            env=dict(os.environ, PYTHONHASHSEED=str(seed))).stdout for seed in (1, 2, 3)}
    assert len(texts) == 1, texts
