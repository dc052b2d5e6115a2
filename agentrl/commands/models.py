"""``agentrl models build [--variant NAME] [--out DIR] [--seed N] [--force]``: builds a tiny CPU model (tokenizer,
chat template, random-init Qwen2 weights) into a Hugging Face model directory and prints its path.

``agentrl models merge-lora ADAPTER OUT [--base DIR]``: writes the base model with a LoRA run's adapter (a
checkpoint's ``model/`` directory) merged into its weights, a plain HF model directory (:func:`agentrl.trainer.lora.merge`)."""

from __future__ import annotations

import argparse


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("models", help="build the tiny model used by CPU tests and demos")
    sub = parser.add_subparsers(dest="models_command", metavar="ACTION")
    build = sub.add_parser("build", help="build the tiny Qwen2-architecture model and its tokenizer")
    build.add_argument("--variant", default="tiny", help="tiny (default), tiny-tool (the tool-use demo's model) or tiny-64k "
                       "(tiny with 65,536 positions)")
    build.add_argument("--out", default=None, help="output directory (default: $AGENTRL_TINY_MODEL or "
                       "~/.cache/agentrl/tiny-model; tiny-tool: $AGENTRL_TINY_TOOL_MODEL or ~/.cache/agentrl/tiny-tool-model)")
    build.add_argument("--seed", type=int, default=0, help="random-init and corpus seed (default 0)")
    build.add_argument("--force", action="store_true", help="rebuild even if an up-to-date model is there")
    build.set_defaults(func=_build)
    merge = sub.add_parser("merge-lora", help="merge a LoRA adapter directory into its base model (a plain HF model)")
    merge.add_argument("adapter", help="adapter directory (adapter_config.json + adapter_model.safetensors), e.g. "
                       "RUN/checkpoints/step_N/model")
    merge.add_argument("out", help="output model directory")
    merge.add_argument("--base", default=None, help="base model directory (default: the adapter's base_model_name_or_path)")
    merge.set_defaults(func=_merge)
    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])


def _build(args: argparse.Namespace) -> int:
    import time

    from agentrl.models import VARIANTS, build_tiny_model, ensure_tiny_model, read_marker

    if args.variant not in VARIANTS:
        print(f"agentrl models build: --variant {args.variant!r} is not one of {sorted(VARIANTS)}")
        return 2
    t0 = time.perf_counter()
    path = (build_tiny_model(args.out, seed=args.seed, variant=args.variant) if args.force
            else ensure_tiny_model(args.out, seed=args.seed, variant=args.variant))
    marker = read_marker(path) or {}
    print(f"{path}  ({marker.get('parameters', '?')} parameters, vocab {marker.get('tokenizer_size', '?')}, "
          f"{time.perf_counter() - t0:.1f} s)")
    return 0


def _merge(args: argparse.Namespace) -> int:
    from agentrl.trainer.lora import merge

    try:
        out = merge(args.adapter, args.out, base=args.base)
    except (ValueError, OSError) as e:
        print(f"agentrl models merge-lora: {e}")
        return 2
    print(out)
    return 0
