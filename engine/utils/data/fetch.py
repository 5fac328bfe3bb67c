"""Fetchers: turn one index (or list of indices) from the loader's sampler into one collated
batch. The same code runs in the main process (num_workers=0) and in worker processes."""

__all__ = ["MapFetcher", "IterableFetcher", "InfiniteConstantSampler", "make_fetcher"]


class InfiniteConstantSampler:
    """The sampler of an iterable dataset: endless Nones (the dataset decides what comes next)."""

    def __iter__(self):
        while True:
            yield None


class MapFetcher:
    def __init__(self, dataset, auto_collation, collate_fn, drop_last):
        self.dataset, self.auto_collation, self.collate_fn = dataset, auto_collation, collate_fn

    def fetch(self, index):
        if self.auto_collation:
            getitems = getattr(self.dataset, "__getitems__", None)
            data = getitems(index) if callable(getitems) else [self.dataset[i] for i in index]
        else:
            data = self.dataset[index]
        return self.collate_fn(data)


class IterableFetcher:
    """Pulls `len(index)` samples from the dataset's iterator per batch; raises StopIteration once
    it is exhausted (or, with drop_last, when only a partial batch is left)."""

    def __init__(self, dataset, auto_collation, collate_fn, drop_last):
        self.dataset_iter = iter(dataset)
        self.auto_collation, self.collate_fn, self.drop_last = auto_collation, collate_fn, drop_last
        self.ended = False

    def fetch(self, index):
        if self.ended:
            raise StopIteration
        if self.auto_collation:
            data = []
            for _ in index:
                try:
                    data.append(next(self.dataset_iter))
                except StopIteration:
                    self.ended = True
                    break
            if not data or (self.drop_last and len(data) < len(index)):
                raise StopIteration
        else:
            data = next(self.dataset_iter)
        return self.collate_fn(data)


def make_fetcher(iterable, dataset, auto_collation, collate_fn, drop_last):
    cls = IterableFetcher if iterable else MapFetcher
    return cls(dataset, auto_collation, collate_fn, drop_last)
