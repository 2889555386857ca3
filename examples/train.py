# torchrun --nproc-per-node 4 examples/train.py /data/train.npy OUTDIR   (no daemon to start)
import sys, torch, torch.distributed as dist, riffle.torch
dist.init_process_group("gloo")
loader = riffle.torch.loader(sys.argv[1], batch_size=256, num_workers=2)
ids, steps = [], 0
for batch in loader:  # one epoch, every rank as many steps; a training step goes here
    steps += 1
    ids += batch["ids"][: len(batch["ids"]) - int(batch["padding"])].tolist()
torch.save({"steps": steps, "ids": ids}, f"{sys.argv[2]}/rank{dist.get_rank()}.pt")
