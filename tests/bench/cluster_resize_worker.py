"""One rank of the cluster resize benchmark (tests/bench/cluster_resize_bench.py).

An ordinary malletrain training loop on synthetic data (an MLP of --width, Adam) that prints
JSON lines with wall-clock times: when the process started, when torch was imported, when the
model was built (ready to join), and, on rank 0, every committed step with the world size, so
the benchmark can tell when the job trained at its new size.
"""

import json
import sys
import time

T_START = time.time()


def emit(**kw):
    print(json.dumps(kw), flush=True)


def main():
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--compute-sleep", type=float, default=0.05)
    args = p.parse_args()
    import torch

    import malletrain
    t_imported = time.time()
    torch.set_num_threads(1)
    job = malletrain.init(logical_workers=6, seed=0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = job.wrap_model(torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 10)))
    opt = job.wrap_optimizer(torch.optim.Adam(model.parameters(), lr=1e-3))
    data = torch.utils.data.TensorDataset(torch.randn(4096, args.width), torch.randint(0, 10, (4096,)))
    loader = job.loader(data, batch_size=8, steps=args.steps)
    emit(ev="ready", member=job.member_id, start=T_START, imported=t_imported, ready=time.time())
    seen = 0
    for x, y in loader:
        if args.compute_sleep:
            time.sleep(args.compute_sleep)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        step = job.step
        opt.step()
        while seen < len(job.history):
            e = job.history[seen]
            seen += 1
            emit(ev="resize", member=job.member_id, kind=e.kind, size=e.size, rank=e.rank,
                 t=time.time(), phases=e.phases, state_bytes=e.state_bytes)
        if job.step > step and job.rank == 0:
            emit(ev="step", step=step, size=job.size, t=time.time())
    job.close()


if __name__ == "__main__":
    sys.exit(main())
