"""Input pipeline: decode-once cache vs decode-every-access, and data stall in a training step.

Measures, in one run on the bundled data/ucmerced-mini (or --root) at 128 px:

1. images/s of the *plain* path (like torchvision ``ImageFolder``: PIL-decode the file on every access,
   then the same training augmentation image by image, stacked into batches) and of the *cached* path
   (``build_datasets(..., cache="memory")``: decoded once, ``get_batch`` augments the stored uint8
   array), and their ratio. Each figure is the best of ``--repeats`` interleaved passes, so noise
   from other processes on the machine hits both paths alike.
2. data stall while training a timm resnet18 (pretrained=False, 21 classes) on CPU at 128 px,
   batch 32, for ``--steps`` steps: the fraction of step time spent waiting for the next batch,
   for the plain path, the cached path (synchronous ``get_batch``), and the cached path through the
   trainer's ``BatchPrefetcher`` (``prefetch=true``: the next batch prepared by a background thread
   during the step), and the device path (``stored_batch`` through the prefetcher, augmented by
   ``DeviceAugment`` on the prefetch thread: ``augment.on_device=true``, a GPU worker's default). The sources take
   turns, ``--repeats`` rounds; median and range per source.

    python benchmarks/bench_data.py [--size 128] [--batch 32] [--steps 10] [--repeats 5]
    python benchmarks/bench_data.py --dataset ucmerced --root tests/fixtures/ucmerced-tif-sample  # real .tif
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rsnet.data import (  # noqa: E402
    BatchPrefetcher,
    HostAugment,
    SceneDataset,
    build_datasets,
    eval_transform,
    train_transform,
)


class PlainImageFolder(torch.utils.data.Dataset):
    """torchvision-ImageFolder-style dataset: decode the file on every access, then augment."""

    def __init__(self, files, labels, size, transform):
        self.files, self.labels, self.size, self.transform = list(files), np.asarray(labels), size, transform

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        with Image.open(self.files[i]) as im:  # torchvision's pil_loader
            img = im.convert("RGB")
        if img.size != (self.size, self.size):
            img = img.resize((self.size, self.size), Image.Resampling.BILINEAR)
        if isinstance(self.transform, HostAugment):  # the training augmentation, a batch of one
            return self.transform.apply([np.asarray(img)], [i])[0], int(self.labels[i])
        return self.transform(image=np.asarray(img))["image"], int(self.labels[i])

    def get_batch(self, indices):
        items = [self[int(i)] for i in indices]
        with one_torch_thread():  # collate as in a DataLoader worker (torch.set_num_threads(1) there)
            return torch.stack([x for x, _ in items]), torch.tensor([y for _, y in items])


@contextlib.contextmanager
def one_torch_thread():
    """Run torch ops on one thread, as DataLoader workers do. With two intra-op threads on a machine whose
    other cores are busy, one ``torch.stack`` of a batch can wait for a descheduled worker thread: that would
    measure the machine's load, not the input path."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def batches(n, batch, seed):
    batch = min(batch, n)
    perm = np.random.default_rng(seed).permutation(n)
    return [perm[i : i + batch] for i in range(0, n - batch + 1, batch)]


def throughput(ds, batch, passes=1):
    n = 0
    t0 = time.perf_counter()
    for p in range(passes):
        for idx in batches(len(ds), batch, p):
            x, _ = ds.get_batch(idx)
            n += len(x)
    return n / (time.perf_counter() - t0)


def stall(model, opt, source, steps):
    """Run ``steps`` training steps, pulling batches from iterator ``source``; return
    (waiting seconds, total seconds)."""
    lossf = torch.nn.CrossEntropyLoss()
    wait = total = 0.0
    it = iter(source)
    x, y = next(it)  # warm-up step (first-call allocations), not timed
    loss = lossf(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    for _ in range(steps):
        t0 = time.perf_counter()
        x, y = next(it)
        t1 = time.perf_counter()
        loss = lossf(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        t2 = time.perf_counter()
        wait += t1 - t0
        total += t2 - t0
    return wait, total


def prefetched(ds, batch, load=None, finish=None):
    """A source factory: ``load`` (default ``ds.get_batch``) through the trainer's BatchPrefetcher (one batch ahead
    on a thread, ``finish`` run there on the loaded batch); closing the source stops the thread."""

    def make():
        prefetcher = BatchPrefetcher(load or ds.get_batch, "cpu", True, finish)
        try:
            for prepared in prefetcher.batches(iter(endless(ds, batch))):
                yield prepared.images, prepared.labels
        finally:
            prefetcher.close()

    return make


def prefetched_on_device(ds, augment, batch):
    """A source factory: the device path, ``ds.stored_batch`` through the BatchPrefetcher with the batch augmented
    by ``augment`` (a DeviceAugment) on the prefetch thread."""

    def finish(images, indices):
        return augment.apply(images, indices, memory_format=torch.contiguous_format)

    return prefetched(ds, batch, ds.stored_batch, finish)


def endless(ds, batch):
    epoch = 0
    while True:
        for idx in batches(len(ds), batch, epoch):
            yield idx
        epoch += 1


def synthetic_aid(folder: Path, per_class: int = 2, size: int = 600) -> Path:
    """A fake AID archive (30 classes x per_class) of size x size JPEGs with smooth random texture,
    to show the cache on AID-sized files (600 px JPEG decoding dominates there)."""
    from rsnet.data import DATASETS

    rng = np.random.default_rng(0)
    for cls in DATASETS["aid"].classes:
        d = folder / "AID" / cls
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            small = rng.integers(0, 256, (size // 8, size // 8, 3), dtype=np.uint8)
            img = Image.fromarray(small).resize((size, size), Image.Resampling.BICUBIC)
            img.save(d / f"{cls.lower()}_{i + 1}.jpg", quality=90)
    return folder / "AID"


def compare(plain, cached, batch, repeats):
    """Best-of-``repeats`` interleaved images/s of both paths."""
    throughput(plain, batch), throughput(cached, batch)  # warm-up (page cache, lazy inits)
    plain_rates, cached_rates = [], []
    for _ in range(repeats):
        plain_rates.append(throughput(plain, batch))
        cached_rates.append(throughput(cached, batch))
    return plain_rates, cached_rates


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="ucmerced_mini")
    ap.add_argument("--root", default=None)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-aid", action="store_true", help="skip the AID-sized (600 px JPEG) comparison")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    return ap.parse_args()


def print_ratio(title, rates):
    """The best images/s of both paths of ``compare`` and their ratio, under ``title``."""
    plain, cached = max(rates[0]), max(rates[1])
    print(title)
    print(f"{'  plain':38s} {plain:10.0f}")
    print(f"{'  cached':38s} {cached:10.0f}")
    print(f"{'  ratio cached / plain':38s} {cached / plain:10.2f}x")


def throughput_report(args, cached, plain):
    """images/s of both paths: training transform, eval transform, and (unless --no-aid) 600 px JPEGs."""
    plain_rates, cached_rates = compare(plain, cached, args.batch, args.repeats)
    # evaluation path (no augmentation: resize + normalise), same images
    ev_cached = SceneDataset(cached.store, cached.rows, cached.labels, cached.names, cached.class_names,
                             eval_transform(args.size))
    ev_plain = PlainImageFolder(cached.paths, cached.labels, args.size, eval_transform(args.size))
    ev = compare(ev_plain, ev_cached, args.batch, args.repeats)
    big = None
    if not args.no_aid:
        with tempfile.TemporaryDirectory() as tmp:
            aid = build_datasets("aid", synthetic_aid(Path(tmp)), 0.999, 0, args.size, check_counts=False).train
            aid_plain = PlainImageFolder(aid.paths, aid.labels, args.size, train_transform(args.size))
            big = compare(aid_plain, aid, args.batch, max(2, args.repeats // 2))
    p, c = max(plain_rates), max(cached_rates)
    print()
    print(f"{'input path':38s} {'images/s':>10s}")
    print(f"{'plain (decode + augment per access)':38s} {p:10.0f}   "
          f"(passes: {', '.join(f'{r:.0f}' for r in plain_rates)})")
    print(f"{'cached (decode once, augment)':38s} {c:10.0f}   (passes: {', '.join(f'{r:.0f}' for r in cached_rates)})")
    print(f"{'ratio cached / plain':38s} {c / p:10.2f}x  (target >= 5x)")
    print_ratio("eval transform only (resize + normalise):", ev)
    if big is not None:
        print_ratio(f"same on 60 synthetic AID-sized files (600 px JPEG -> {args.size} px):", big)


def stall_report(args, num_classes, cached, plain, augment):
    """Data stall of a resnet18 training step fed by each input path, the paths taking turns."""
    import timm

    model = timm.create_model("resnet18", pretrained=False, num_classes=num_classes)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sources = {
        "plain (decode+augment per access)": lambda: (plain.get_batch(i) for i in endless(plain, args.batch)),
        "cached, get_batch in the loop": lambda: (cached.get_batch(i) for i in endless(cached, args.batch)),
        "cached + BatchPrefetcher (prefetch)": prefetched(cached, args.batch),
        "cached uint8 + prefetch + DeviceAugment": prefetched_on_device(cached, augment, args.batch),
    }
    rows: dict[str, list[tuple[float, float]]] = {name: [] for name in sources}
    for _ in range(args.repeats):  # the sources take turns: load hits all alike
        for name, make in sources.items():
            src = make()
            rows[name].append(stall(model, opt, src, args.steps))
            src.close()
    print()
    print(f"data stall, timm resnet18 on CPU, {args.size} px, batch {args.batch}, {args.steps} steps x "
          f"{args.repeats} interleaved rounds (target < 5 %):")
    print(f"{'input path':40s} {'step s':>8s} {'wait ms':>8s} {'stall (median, range)':>24s}")
    for name, runs in rows.items():
        stalls = sorted(100 * wait / total for wait, total in runs)
        steps = statistics.median(total for _, total in runs) / args.steps
        waits = statistics.median(wait for wait, _ in runs) / args.steps
        print(f"{name:40s} {steps:8.3f} {1000 * waits:8.1f} {statistics.median(stalls):8.2f}% "
              f"({stalls[0]:.2f}-{stalls[-1]:.2f})")


def main():
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    bundle = build_datasets(args.dataset, args.root, 0.999, 0, args.size, cache="memory", check_counts=False)
    build_s = time.perf_counter() - t0
    cached = bundle.train  # ~all images, augmenting transform
    plain = PlainImageFolder(cached.paths, cached.labels, args.size, train_transform(args.size))
    print(f"dataset {args.dataset}: {len(cached)} images at {args.size} px; decode-once build {build_s:.2f} s "
          f"({len(cached) / build_s:.0f} img/s incl. scan, {cached.images.nbytes / 1e6:.1f} MB); "
          f"torch threads {torch.get_num_threads()}, cpus {os.cpu_count()}")
    throughput_report(args, cached, plain)
    if args.steps > 0:
        stall_report(args, len(bundle.class_names), cached, plain, bundle.train_augment)


if __name__ == "__main__":
    main()
