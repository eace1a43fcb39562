import itertools, torch
from functools import partial
from triton.testing import do_bench_cudagraph
from wick.kernels.fp8_matmul import fp8_expert_gemv
L, E = 8, 128
for name, n, k in (("gate_up", 1536, 2048), ("down", 2048, 768)):
    w = [torch.randn(E, n, k, device="cuda").to(torch.float8_e4m3fn) for _ in range(L)]
    for kind, block in (("block", (128, 128)), ("row", (1, k))):
        s = [torch.ones(E, -(-n // block[0]), -(-k // block[1]), device="cuda") for _ in range(L)]
        for pairs in (8, 32):
            x = torch.randn(pairs, k, device="cuda", dtype=torch.bfloat16)
            ids = [torch.randperm(E, device="cuda")[:pairs].int() for _ in range(L)]
            res = {}
            for cfg in itertools.product([2, 4, 8, 16], [256, 512, 1024], [1, 2, 4]):
                def run(cfg=cfg):
                    for l in range(L):
                        fp8_expert_gemv(x, w[l], s[l], block, ids[l], 1, cfg)
                try:
                    run(); res[cfg] = do_bench_cudagraph(run) / L * 1e3
                except Exception as e:
                    print(name, kind, pairs, cfg, type(e).__name__)
            best = sorted(res, key=res.get)[:3]
            mb = pairs * n * k / 1e6
            print(f"{name} {kind} pairs {pairs}: default (4,1024,2) {res[(4,1024,2)]:.1f} us; best " + ", ".join(f"{c} {res[c]:.1f} us ({mb / res[c] / 3.0:.0%})" for c in best))
