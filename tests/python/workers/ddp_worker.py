"""DDP on smddp: 20 SGD steps of a small MLP must equal the same DDP on gloo and a
single-process full-batch reference (float64, rtol 1e-6), for several DDP options."""


import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from common import Checker, init

rank, W = init()
gloo = dist.new_group(backend="gloo")
chk = Checker(rank)
STEPS, B = 20, 4  # per-rank batch
torch.manual_seed(0)
# One fixed batch (so the loss must fall), seen through a different permutation every step.
X0 = torch.randn(W * B, 8, dtype=torch.float64)
Y0 = torch.randn(W * B, 3, dtype=torch.float64)
PERMS = [torch.randperm(W * B) for _ in range(STEPS)]
X = torch.stack([X0[p] for p in PERMS])
Y = torch.stack([Y0[p] for p in PERMS])


class MLP(nn.Module):
    def __init__(self, unused=False, bn=False):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16) if bn else nn.Identity()
        self.fc2 = nn.Linear(16, 3)
        self.unused = nn.Linear(16, 3) if unused else None

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def make_model(**kw):
    torch.manual_seed(1)
    return MLP(**kw).double()


def train_ddp(group, accumulate=1, hook=None, ddp_kwargs=None, model_kwargs=None, dtype=torch.float64):
    model = make_model(**(model_kwargs or {})).to(dtype)
    ddp = DDP(model, process_group=group, **(ddp_kwargs or {}))
    if hook is not None:
        ddp.register_comm_hook(group, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    losses = []
    for step in range(STEPS):
        x = X[step, rank * B:(rank + 1) * B].to(dtype)
        y = Y[step, rank * B:(rank + 1) * B].to(dtype)
        opt.zero_grad()
        if accumulate > 1:
            # no_sync for all but the last micro-batch; scale so the result is the full mean.
            mbs = x.chunk(accumulate)
            ybs = y.chunk(accumulate)
            with ddp.no_sync():
                for xb, yb in zip(mbs[:-1], ybs[:-1]):
                    (nn.functional.mse_loss(ddp(xb), yb) / accumulate).backward()
            loss = nn.functional.mse_loss(ddp(mbs[-1]), ybs[-1]) / accumulate
        else:
            loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses


def train_reference():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        opt.zero_grad()
        nn.functional.mse_loss(model(X[step]), Y[step]).backward()
        opt.step()
    return model


def compare_models(a, b, rtol, what):
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items()):
        if pa.is_floating_point() and not torch.allclose(pa.double(), pb.double(), rtol=rtol, atol=rtol * 1e-2):
            return "%s: %s differs (max abs diff %g)" % (what, name, (pa.double() - pb.double()).abs().max().item())
        if not pa.is_floating_point() and not torch.equal(pa, pb):
            return "%s: %s differs" % (what, name)


def same_on_all_ranks(model):
    # Parameters only: BatchNorm running stats are per rank after the last forward.
    flat = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
    outs = [torch.zeros_like(flat) for _ in range(W)]
    dist.all_gather(outs, flat, group=gloo)
    for r in range(W):
        if not torch.equal(outs[r], flat):
            return "rank %d's model differs from rank %d's" % (r, rank)


def case(name, rtol_ref=1e-6, vs_reference=True, rtol_gloo=1e-6, **kw):
    def body():
        m_smddp, losses = train_ddp(None, **kw)
        m_gloo, _ = train_ddp(gloo, **kw)
        err = same_on_all_ranks(m_smddp) or compare_models(m_smddp, m_gloo, rtol_gloo, "smddp vs gloo")
        if err:
            return err
        if vs_reference:
            err = compare_models(m_smddp, REFERENCE, rtol_ref, "smddp vs single-process reference")
            if err:
                return err
        before = nn.functional.mse_loss(make_model(**kw.get("model_kwargs", None) or {}).to(m_smddp.fc1.weight.dtype)(X0.to(m_smddp.fc1.weight.dtype)), Y0.to(m_smddp.fc1.weight.dtype)).item()
        after = nn.functional.mse_loss(m_smddp(X0.to(m_smddp.fc1.weight.dtype)), Y0.to(m_smddp.fc1.weight.dtype)).item()
        if not after < before:
            return "full-batch loss did not decrease: %g -> %g" % (before, after)
    chk.run("ddp." + name, body)


REFERENCE = train_reference()
case("plain")
case("no_sync", accumulate=2)
case("find_unused_parameters", ddp_kwargs={"find_unused_parameters": True}, model_kwargs={"unused": True})
case("gradient_as_bucket_view", ddp_kwargs={"gradient_as_bucket_view": True})
case("small_buckets", ddp_kwargs={"bucket_cap_mb": 0.0001})
case("static_graph", ddp_kwargs={"static_graph": True}) if "static_graph" in DDP.__init__.__code__.co_varnames else None
# fp16 compression rounds the gradients: close to gloo with the same hook, not to the reference.
# Not equal with more than 2 ranks: smddp sums float16 in float32 and rounds once, gloo rounds
# after every addition; the difference stays within a few float16 ulps.
case("fp16_compress_hook", vs_reference=False, rtol_gloo=1e-6 if W <= 2 else 2e-3,
     hook=default_hooks.fp16_compress_hook)
# BatchNorm statistics are per rank: buffers are broadcast from rank 0, so compare with gloo only.
case("broadcast_buffers", vs_reference=False, model_kwargs={"bn": True}, ddp_kwargs={"broadcast_buffers": True})
case("float32", vs_reference=False, dtype=torch.float32)

dist.barrier()
dist.destroy_process_group()
raise SystemExit(chk.finish())
