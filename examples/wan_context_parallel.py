"""A Wan2.1 denoising loop on several processes: diffusers' context parallelism with the "wavealign" backend.

    torchrun --standalone --nproc-per-node 2 examples/wan_context_parallel.py                 # 2 GPUs, NCCL, bf16
    torchrun --standalone --nproc-per-node 2 examples/wan_context_parallel.py --device cpu    # gloo, float32

Every rank builds the same random-weight WanTransformer3DModel (examples/wan_t2v.py's tiny structure, 2 heads
per rank; head_dim 128 on a GPU, where the fused kernel runs), sets its attention backend to "wavealign" and
enables diffusers' Ulysses context parallelism over all ranks. Each self-attention then runs on the rank's
heads over the whole sequence: the mask method (--method) on those heads' q and k, their plan, and the kernel
(--backend, --precision) in plan order; WanPipeline runs the loop. Rank 0 then runs the same loop in one
process and prints the largest difference between the two latents: 0 on the CPU, where every operation of a
token or a head is computed the same way on a shard as on the whole (tests/python/test_diffusers_backend.py
checks it); on GPUs the projections of L/P tokens may take other GEMM kernels than those of L tokens.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import wavealign.diffusers
from wan_t2v import TINY, build_transformer, context_parallel_config, mask_method, pipeline, text_embeddings


def denoise(transformer, device, dtype, args) -> torch.Tensor:
    config = transformer.config
    prompt, negative = (text_embeddings(config, device, dtype, seed, length=16) for seed in (1, 2))
    with wavealign.diffusers.BackendOptions(mask_method(args.method, args.block, 0.25), backend=args.backend,
                                            precision=args.precision, block_size=args.block):
        pipe = pipeline(transformer, flow_shift=5.0)
        pipe.set_progress_bar_config(disable=True)
        return pipe(
            prompt_embeds=prompt, negative_prompt_embeds=negative, height=args.height, width=args.width,
            num_frames=args.frames, num_inference_steps=args.steps, guidance_scale=5.0, output_type="latent",
            generator=torch.Generator().manual_seed(0)).frames


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--method", default="pooled",
                        help="pooled, or a wavealign.methods name: xattention, sparge, minference, flexprefill")
    parser.add_argument("--backend", default="wavealign", choices=wavealign.diffusers.BACKENDS)
    parser.add_argument("--precision", default="native", help="native, or int8 (the 8-bit kernel)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--frames", type=int, default=None, help="video frames (default 17 on CUDA, 9 on CPU)")
    parser.add_argument("--height", type=int, default=None, help="pixels (default 256 on CUDA, 128 on CPU)")
    parser.add_argument("--width", type=int, default=None, help="pixels (default 256 on CUDA, 128 on CPU)")
    parser.add_argument("--block", type=int, default=None, help="mask block edge (default 128 on CUDA, 16 on CPU)")
    args = parser.parse_args()

    cuda = args.device == "cuda"
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    args.frames, args.height, args.width = args.frames or (17 if cuda else 9), args.height or (256 if cuda else 128), \
        args.width or (256 if cuda else 128)
    args.block = args.block or (128 if cuda else 16)
    config = dict(TINY, num_attention_heads=2 * world, attention_head_dim=128 if cuda else 32)
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)   # the ranks share the host's cores; rank 0's one-process run uses 1 thread too
    # "cpu:gloo" names the device: diffusers exchanges shard sizes on the CPU only where the backend says "cpu"
    dist.init_process_group("cuda:nccl" if cuda else "cpu:gloo")
    try:
        transformer = build_transformer(config, device, dtype, seed=0)
        transformer.set_attention_backend("wavealign")
        transformer.enable_parallelism(config=context_parallel_config(device, ulysses_degree=world))
        latents = denoise(transformer, device, dtype, args)
        if rank == 0:
            alone = build_transformer(config, device, dtype, seed=0)
            alone.set_attention_backend("wavealign")
            one_process = denoise(alone, device, dtype, args)
            difference = (latents.float() - one_process.float()).abs().max().item()
            print(f"{world} ranks, {config['num_attention_heads']} heads, {args.method} mask, {args.backend} "
                  f"kernel ({args.precision}), {dtype} on {args.device}: latents {tuple(latents.shape)}, finite: "
                  f"{bool(torch.isfinite(latents).all())}; max |context parallel - one process| = {difference:g}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
