"""A Wan2.1 text-to-video denoising loop with wavealign's sparse self-attention (random weights, no download).

The transformer is diffusers' WanTransformer3DModel built from a configuration with random weights: the
Wan2.1-T2V-14B one (40 heads x 128, ffn 13,824, 40 layers) on a GPU, a tiny one on the CPU. Random text
embeddings stand in for the T5 encoder and the loop stops at the latents (no VAE). diffusers' WanPipeline runs
the loop with its UniPC flow-matching scheduler and classifier-free guidance; wavealign.diffusers swaps the
self-attention of every block, and WanPipeline's cache context tells it the step and the branch (cond/uncond).
Per step it prints the wall time and the self-attention's mask, plan and attention time.

    python examples/wan_t2v.py                                  # GPU: 14B config, 81 frames at 1280x720, bf16
    python examples/wan_t2v.py --steps 4 --method xattention --dense-steps 1 --backend fa4
    python examples/wan_t2v.py --device cpu                     # tiny config, float32 CPU reference

--method pooled (the default) is a small stand-in mask method (pooled q/k block scores, the top blocks of each
row, and the diagonal); xattention, sparge, minference and flexprefill come from wavealign.methods; dense
runs diffusers' own attention everywhere. bench/gpu/bench_e2e.py builds its model with this file's helpers.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import torch

import wavealign
import wavealign.diffusers

WAN21_T2V_14B = dict(patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128, in_channels=16,
                     out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40,
                     cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
"""diffusers' transformer config of Wan-AI/Wan2.1-T2V-14B-Diffusers."""

TINY = dict(WAN21_T2V_14B, num_attention_heads=2, attention_head_dim=32, in_channels=4, out_channels=4,
            text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2, rope_max_seq_len=64)
"""A CPU-sized transformer of the same structure (2 heads x 32, 2 layers)."""

TEMPORAL_COMPRESSION, SPATIAL_COMPRESSION = 4, 8   # Wan's VAE: frames 4:1 (plus the first), pixels 8:1


def tokens(config: dict[str, Any], frames: int, height: int, width: int) -> int:
    """Self-attention sequence length of a video: latent frames x latent pixels / patch."""
    patch_t, patch_h, patch_w = config["patch_size"]
    latent_frames = (frames - 1) // TEMPORAL_COMPRESSION + 1
    return ((latent_frames // patch_t) * (height // SPATIAL_COMPRESSION // patch_h)
            * (width // SPATIAL_COMPRESSION // patch_w))


def build_transformer(config: dict[str, Any], device: torch.device, dtype: torch.dtype, seed: int = 0,
                      layers: int | None = None) -> Any:
    """WanTransformer3DModel with random weights on `device`; `layers` overrides num_layers.

    Like from_pretrained(torch_dtype=dtype), the parameters of the model's _keep_in_fp32_modules (norms,
    time embedder, modulation tables) stay float32.
    """
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    options = dict(config, num_layers=layers if layers is not None else config["num_layers"])
    with torch.device(device):
        model = WanTransformer3DModel(**options)
    keep = WanTransformer3DModel._keep_in_fp32_modules or []
    for name, parameter in model.named_parameters():
        parameter.data = parameter.data.to(torch.float32 if any(part in keep for part in name.split(".")) else dtype)
    return model.eval().requires_grad_(False)


def text_embeddings(config: dict[str, Any], device: torch.device, dtype: torch.dtype, seed: int,
                    length: int = 512) -> torch.Tensor:
    """Random stand-ins for the T5 prompt embeddings [1, length, text_dim] (T5's outputs are O(0.1))."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return (0.1 * torch.randn(1, length, config["text_dim"], generator=generator)).to(device, dtype)


class PooledTopK:
    """Stand-in mask method: per query block, the KV blocks of the highest pooled q.k score, and the diagonal.

    __call__(q, k) with q, k [B, H, L, d] -> bool [B*H, MB, NB]; a partial last block is pooled over its tokens.
    """

    __name__ = "pooled"

    def __init__(self, block: int, density: float) -> None:
        self.block = block
        self.density = density

    def _pool(self, x: torch.Tensor) -> torch.Tensor:
        batch, heads, length, dim = x.shape
        blocks = math.ceil(length / self.block)
        padded = torch.nn.functional.pad(x.float(), (0, 0, 0, blocks * self.block - length))
        counts = torch.full((blocks,), float(self.block), device=x.device)
        counts[-1] = length - (blocks - 1) * self.block
        return padded.view(batch, heads, blocks, self.block, dim).sum(3) / counts[:, None]

    def __call__(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        scores = self._pool(q) @ self._pool(k).transpose(-1, -2)
        blocks = scores.shape[-1]
        keep = max(1, round(self.density * blocks))
        mask = torch.zeros_like(scores, dtype=torch.bool)
        mask.scatter_(-1, scores.topk(keep, dim=-1).indices, True)
        diagonal = torch.arange(blocks, device=q.device)
        mask[..., diagonal, diagonal] = True
        return mask.flatten(0, 1)


def mask_method(name: str, block: int, density: float) -> Any:
    """The --method argument as wavealign.diffusers.apply takes it."""
    return PooledTopK(block, density) if name == "pooled" else name


def context_parallel_config(device: torch.device, **degrees: int) -> Any:
    """diffusers' ContextParallelConfig (ulysses_degree=..., ring_degree=...) for ranks whose tensors live on
    `device`, to pass to `transformer.enable_parallelism(config=...)` after init_process_group.

    On the CPU (gloo) the config carries a CPU device mesh: without one, diffusers 0.42.1 builds its mesh on the
    machine's accelerator (init_device_mesh(torch._C._get_accelerator().type)), a CUDA mesh on a GPU host, which
    gloo ranks on the CPU cannot use (on the H200 host the example's ranks failed there; forked ones cannot
    initialize CUDA at all). It also records each rank's device as rank % torch.accelerator.device_count(), which
    divides by zero on a host without an accelerator; that device is only recorded, so any count will do there.
    """
    from diffusers import ContextParallelConfig

    config = ContextParallelConfig(**degrees)
    if device.type == "cpu":
        config.mesh = torch.distributed.device_mesh.init_device_mesh("cpu", config.mesh_shape,
                                                                     mesh_dim_names=config.mesh_dim_names)
        if torch.accelerator.device_count() == 0:
            torch.accelerator.device_count = lambda: 1
    return config


def pipeline(transformer: Any, flow_shift: float) -> Any:
    """WanPipeline around the transformer: UniPC flow matching (Wan's scheduler), no tokenizer, encoder or VAE."""
    from diffusers import UniPCMultistepScheduler, WanPipeline

    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                        num_train_timesteps=1000, flow_shift=flow_shift)
    return WanPipeline(tokenizer=None, text_encoder=None, vae=None, scheduler=scheduler, transformer=transformer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--config", choices=("14b", "tiny"), default=None, help="default: 14b on CUDA, else tiny")
    parser.add_argument("--layers", type=int, default=None, help="override the config's 40 (or 2) layers")
    parser.add_argument("--frames", type=int, default=None, help="video frames (default 81 on CUDA, 9 on CPU)")
    parser.add_argument("--height", type=int, default=None, help="pixels (default 720 on CUDA, 64 on CPU)")
    parser.add_argument("--width", type=int, default=None, help="pixels (default 1280 on CUDA, 64 on CPU)")
    parser.add_argument("--steps", type=int, default=None, help="denoising steps (default 50 on CUDA, 3 on CPU)")
    parser.add_argument("--guidance", type=float, default=5.0, help="classifier-free guidance scale (>1: 2 calls)")
    parser.add_argument("--flow-shift", type=float, default=5.0, help="scheduler shift (Wan: 5 at 720p)")
    parser.add_argument("--method", default="pooled",
                        help="pooled, dense, or a wavealign.methods name: xattention, sparge, minference, flexprefill")
    parser.add_argument("--density", type=float, default=0.25, help="kept blocks per row of --method pooled")
    parser.add_argument("--backend", default="wavealign", choices=wavealign.diffusers.BACKENDS)
    parser.add_argument("--order", default="wavealign", help="row order: wavealign, s1, s2, original, shuffled")
    parser.add_argument("--skip", default="auto", help="wavealign skip policy: auto, never or always")
    parser.add_argument("--dense-steps", type=int, default=0)
    parser.add_argument("--dense-layers", type=int, default=0)
    parser.add_argument("--block", type=int, default=None, help="mask block edge (default 128 on CUDA, 16 on CPU)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    config = WAN21_T2V_14B if (args.config or ("14b" if cuda else "tiny")) == "14b" else TINY
    frames, height, width = args.frames or (81 if cuda else 9), args.height or (720 if cuda else 64), \
        args.width or (1280 if cuda else 64)
    steps, block = args.steps or (50 if cuda else 3), args.block or (128 if cuda else 16)
    dtype = torch.bfloat16 if cuda else torch.float32

    start = time.perf_counter()
    transformer = build_transformer(config, device, dtype, args.seed, args.layers)
    pipe = pipeline(transformer, args.flow_shift)
    length = tokens(config, frames, height, width)
    print(f"Wan2.1 {'14B' if config is WAN21_T2V_14B else 'tiny'} config, {len(transformer.blocks)} layers, "
          f"random weights, {dtype} on {device}: {frames} frames at {width}x{height} = {length} tokens "
          f"(built in {time.perf_counter() - start:.1f} s)")
    handle = wavealign.diffusers.apply(transformer, mask_method(args.method, block, args.density),
                                       backend=args.backend, order=args.order, skip=args.skip,
                                       dense_steps=args.dense_steps, dense_layers=args.dense_layers,
                                       block_size=block, timing=True)
    print(handle)

    wall: list[float] = []

    def step_end(pipe: Any, step: int, timestep: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        if cuda:
            torch.cuda.synchronize(device)
        wall.append(time.perf_counter())
        return {}

    prompt = text_embeddings(config, device, dtype, args.seed)
    negative = text_embeddings(config, device, dtype, args.seed + 1)
    wall.append(time.perf_counter())
    latents = pipe(prompt_embeds=prompt, negative_prompt_embeds=negative, height=height, width=width,
                   num_frames=frames, num_inference_steps=steps, guidance_scale=args.guidance,
                   output_type="latent", callback_on_step_end=step_end,
                   generator=torch.Generator(device="cpu").manual_seed(args.seed)).frames

    per_step: dict[int, dict[str, float]] = {}
    for row in handle.step_times():
        total = per_step.setdefault(row["step"], {"mask_ms": 0.0, "plan_ms": 0.0, "attention_ms": 0.0,
                                                  "sparse_calls": 0, "dense_calls": 0})
        for name in total:
            total[name] += row[name]
    print(f"{'step':>4} {'wall ms':>10} {'self-attn ms':>12} {'mask ms':>9} {'plan ms':>9} {'sparse/dense calls':>19}")
    for step, row in sorted(per_step.items()):
        step_ms = 1e3 * (wall[step + 1] - wall[step])
        print(f"{step:>4} {step_ms:>10.1f} {row['attention_ms']:>12.1f} {row['mask_ms']:>9.2f} "
              f"{row['plan_ms']:>9.2f} {row['sparse_calls']:>9.0f}/{row['dense_calls']:.0f}")
    total_ms = 1e3 * (wall[-1] - wall[0])
    attention_ms = sum(row["attention_ms"] + row["mask_ms"] + row["plan_ms"] for row in per_step.values())
    print(f"{steps} steps in {total_ms / 1e3:.2f} s; self-attention with mask and plan "
          f"{100 * attention_ms / total_ms:.1f} % of it; latents {tuple(latents.shape)}, "
          f"finite: {bool(torch.isfinite(latents).all())}")
    wavealign.diffusers.remove(transformer)


if __name__ == "__main__":
    main()
