#!/usr/bin/env python3
"""Regenerate the kernel golden fixtures in tests/fixtures/kernels/ with PyTorch (CPU).

Usage: /usr/bin/python3 tools/gen_kernel_fixtures.py [--only NAME ...]
Needs torch (Debian's python3-torch is enough). CI does not run this: the fixtures are committed.
References are computed in float64 from the fp32-rounded inputs, then stored as fp32."""
import argparse
import importlib
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
# Generators in golden/ that are not kernel goldens: they write elsewhere and have their own command
# (gen_target_fixtures.py: tests/fixtures/target, with transformers and safetensors).
NOT_KERNELS = {"target_fixtures"}
sys.path.insert(0, str(HERE / "golden"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=None, help="generator names (gen_<name>.py)")
    ap.add_argument("--out", default=str(HERE.parent / "tests" / "fixtures" / "kernels"))
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for mod_path in sorted((HERE / "golden").glob("gen_*.py")):
        name = mod_path.stem[4:]
        if name in NOT_KERNELS:
            continue
        if args.only and name not in args.only:
            continue
        mod = importlib.import_module(mod_path.stem)
        mod.generate(out)
        print(f"generated {name}")


if __name__ == "__main__":
    main()
