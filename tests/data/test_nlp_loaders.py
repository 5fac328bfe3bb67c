"""Samplers (resume, data-parallel shards), Instance/DistTensorData collate and global
conversion, build_nlp_train_val_test_loader, and the trainer's batch hook."""
import numpy as np
import pytest

import engine as flow
from libai.config import LazyCall
from libai.data import (CyclicSampler, DistTensorData, GPT2Dataset, Instance, SingleRoundSampler,
                        build_nlp_train_val_test_loader, default_collate, get_train_valid_test_split_,
                        train_val_test_num_samples)


def take(it, n):
    return [next(it) for _ in range(n)]


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("dp", [1, 2, 4])
def test_cyclic_sampler_resume_is_exact_continuation(shuffle, dp):
    n, mb = 37, 3
    for rank in range(dp):
        full = take(iter(CyclicSampler(n, mb, shuffle=shuffle, seed=11, data_parallel_rank=rank,
                                       data_parallel_size=dp)), 30)
        for k in (0, 1, 5, 17):
            resumed = CyclicSampler(n, mb, shuffle=shuffle, seed=11, consumed_samples=k * mb * dp,
                                    data_parallel_rank=rank, data_parallel_size=dp)
            assert take(iter(resumed), 30 - k) == full[k:]
        # state_dict / load_state_dict mid-stream
        s = CyclicSampler(n, mb, shuffle=shuffle, seed=11, data_parallel_rank=rank, data_parallel_size=dp)
        it = iter(s)
        take(it, 7)
        state = s.state_dict()
        s2 = CyclicSampler(n, mb, shuffle=shuffle, seed=11, data_parallel_rank=rank, data_parallel_size=dp)
        s2.load_state_dict(state)
        assert take(iter(s2), 10) == take(it, 10)


@pytest.mark.parametrize("dp", [2, 3, 4])
def test_data_parallel_shards_are_disjoint(dp):
    n, mb = 50, 2
    iters = [iter(CyclicSampler(n, mb, seed=0, data_parallel_rank=r, data_parallel_size=dp)) for r in range(dp)]
    per_epoch = n // (mb * dp)
    seen = []
    for _ in range(per_epoch):
        batches = [next(it) for it in iters]
        flat = [i for b in batches for i in b]
        assert len(set(flat)) == len(flat)  # no sample on two ranks in a step
        seen.extend(flat)
    assert len(set(seen)) == len(seen) == per_epoch * mb * dp  # nor twice within an epoch
    # evaluation: contiguous disjoint shares covering everything
    shares = [[i for b in SingleRoundSampler(n, 4, data_parallel_rank=r, data_parallel_size=dp) for i in b]
              for r in range(dp)]
    assert sorted(i for s in shares for i in s) == list(range(n))


def test_instance_stack_and_to_global_single_process():
    samples = [Instance(input_ids=DistTensorData(flow.tensor(np.arange(i, i + 5, dtype=np.int64))),
                        labels=DistTensorData(flow.tensor(np.arange(i + 1, i + 6, dtype=np.int64)), placement_idx=-1),
                        meta=[i])
               for i in range(3)]
    batch = default_collate(samples)
    assert isinstance(batch, Instance)
    assert tuple(batch.input_ids.tensor.shape) == (3, 5)
    assert batch.labels.placement_idx == -1 and batch.meta == [[0], [1], [2]]
    inputs = batch.to_model_inputs("cpu")
    x = inputs["input_ids"]
    assert x.is_global and x.placement.ranks == [0] and tuple(x.shape) == (3, 5)
    assert np.array_equal(x.to_local().numpy(), np.stack([np.arange(i, i + 5) for i in range(3)]))
    assert inputs["labels"].is_global and inputs["meta"] == [[0], [1], [2]]
    with pytest.raises(ValueError):
        DistTensorData.stack([DistTensorData(flow.tensor([1, 2])), DistTensorData(flow.tensor([1, 2, 3]))])


def test_split_boundaries():
    assert get_train_valid_test_split_(1000, [949, 50, 1]) == [0, 949, 999, 1000]
    assert get_train_valid_test_split_(79, [949., 50., 1.]) == [0, 75, 79, 79]
    assert get_train_valid_test_split_(10, "8,1,1") == [0, 8, 9, 10]
    assert get_train_valid_test_split_(100, [1, 0, 0]) == [0, 100, 100, 100]
    assert train_val_test_num_samples(100, 8, eval_iter=5, test_global_batch_size=4) == [800, 20, 20]
    assert train_val_test_num_samples(100, 8, eval_iter=5, eval_period=50) == [800, 120, 120]


def _loader_cfg(corpus, **kw):
    args = dict(dataset=[LazyCall(GPT2Dataset)(name="gpt-2", data_prefix=corpus["data_prefix"], seq_length=32,
                                               seed=1234)],
                splits=[[90.0, 8.0, 2.0]], weights=[1.0], train_val_test_num_samples=[96, 16, 8],
                train_batch_size=4, test_batch_size=2, seed=0)
    args.update(kw)
    return args


def test_build_nlp_train_val_test_loader(corpus):
    train, valid, test = build_nlp_train_val_test_loader(**_loader_cfg(corpus))
    n_docs = len(train.dataset.indexed_dataset.sizes)
    b = get_train_valid_test_split_(n_docs, [90.0, 8.0, 2.0])
    for loader, (lo, hi), ns in ((train, b[0:2], 96), (valid, b[1:3], 16), (test, b[2:4], 8)):
        ds = loader.dataset
        assert np.array_equal(ds.documents, np.arange(lo, hi)) and len(ds) >= ns
        assert set(np.unique(np.asarray(ds.doc_idx)).tolist()) <= set(range(lo, hi))
    batch = next(iter(train))
    assert isinstance(batch, Instance) and tuple(batch.input_ids.tensor.shape) == (4, 32)
    assert np.array_equal(batch.input_ids.tensor.numpy()[:, 1:], batch.labels.tensor.numpy()[:, :-1])
    vb = list(valid)
    assert sum(x.input_ids.tensor.shape[0] for x in vb) == len(valid.dataset)
    # resume: a loader built with consumed_samples continues the first one's stream
    # (the sampler keeps its position across iter() calls: start from a fresh loader)
    train, _, _ = build_nlp_train_val_test_loader(**_loader_cfg(corpus))
    it = iter(train)
    first = [next(it).input_ids.tensor.numpy() for _ in range(6)]
    train2, _, _ = build_nlp_train_val_test_loader(**_loader_cfg(corpus, consumed_samples=2 * 4))
    it2 = iter(train2)
    assert all(np.array_equal(next(it2).input_ids.tensor.numpy(), first[k]) for k in range(2, 6))
    # state_dict round trip through the loader (what the checkpointer saves)
    train3, _, _ = build_nlp_train_val_test_loader(**_loader_cfg(corpus))
    train3.load_state_dict(train2.state_dict())
    assert np.array_equal(next(iter(train3)).input_ids.tensor.numpy(), next(it2).input_ids.tensor.numpy())


def test_loader_through_instantiate_and_trainer_hook(corpus):
    """As DefaultTrainer builds it: instantiate(cfg.dataloader.train, train_batch_size=..., ...),
    with _recursive_=False (LiBai) and recursively (datasets built first, then re-split)."""
    from libai.config import instantiate
    from libai.engine.default import DefaultTrainer

    for recursive in (False, True):
        cfg = LazyCall(build_nlp_train_val_test_loader)(**{k: v for k, v in _loader_cfg(corpus).items()
                                                           if k not in ("train_batch_size", "test_batch_size",
                                                                        "seed")})
        if not recursive:
            cfg._recursive_ = False
        from omegaconf import OmegaConf
        cfg = OmegaConf.create(cfg) if not OmegaConf.is_config(cfg) else cfg
        train, valid, test = instantiate(cfg, train_batch_size=4, test_batch_size=2, seed=0)
        batch = next(iter(train))
        inputs = DefaultTrainer.get_batch(batch, "cpu")
        assert set(inputs) == {"input_ids", "labels"}
        assert all(v.is_global and tuple(v.shape) == (4, 32) for v in inputs.values())
        assert valid is not None and test is not None


def test_empty_split_gives_none(corpus):
    train, valid, test = build_nlp_train_val_test_loader(**_loader_cfg(corpus, splits=[[100.0, 0.0, 0.0]]))
    assert train is not None and valid is None and test is None
