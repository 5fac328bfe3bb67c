"""
Train a small classifier for one epoch, fed by a multi-process DataLoader (a torch script).

The data are Gaussian blobs made with numpy, so every library sees the same points; each sample
also reports its index and the DataLoader worker that fetched it, so the run can show that the
epoch covered every sample once, in shuffled order, and that both workers did the fetching.
"""
import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F
from torch.utils.data import Dataset, DataLoader, get_worker_info


class Blobs(Dataset):
    """`n` points around `num_classes` centres in `dim` dimensions; the label is the centre."""

    def __init__(self, n, dim, num_classes, seed=0):
        rng = np.random.default_rng(seed)
        centres = 3.0 * rng.standard_normal((num_classes, dim))
        self.labels = rng.integers(0, num_classes, n)
        self.points = (centres[self.labels] + rng.standard_normal((n, dim))).astype(np.float32)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        info = get_worker_info()
        return {'x': self.points[i], 'y': int(self.labels[i]), 'index': i,
                'worker': -1 if info is None else info.id}


def collate(batch):
    x = torch.stack([torch.from_numpy(b['x']) for b in batch])
    y = torch.tensor([b['y'] for b in batch], dtype=torch.long)
    index = torch.tensor([b['index'] for b in batch], dtype=torch.long)
    workers = sorted({b['worker'] for b in batch})
    return x, y, index, workers


def main():
    torch.manual_seed(0)
    dataset = Blobs(n=512, dim=8, num_classes=4)
    loader = DataLoader(dataset, batch_size=32, shuffle=True, num_workers=2, collate_fn=collate)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    losses, order, workers = [], [], set()
    model.train()
    for x, y, index, batch_workers in loader:  # one epoch
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        order.extend(index.tolist())
        workers.update(batch_workers)

    model.eval()
    with torch.no_grad():
        pred = model(torch.from_numpy(dataset.points)).argmax(dim=-1)
        accuracy = (pred == torch.from_numpy(dataset.labels)).float().mean().item()
    print(f"batches {len(losses)}")
    print(f"first loss {losses[0]:.4f}, last loss {np.mean(losses[-4:]):.4f}")
    print(f"samples {len(order)}, unique {len(set(order))}, shuffled {order != sorted(order)}")
    print(f"workers {sorted(workers)}")
    print(f"accuracy {accuracy:.4f}")


if __name__ == '__main__':
    main()
