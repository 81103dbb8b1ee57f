#!/usr/bin/env python3
"""PNG charts of a draftforge run from its metrics.jsonl (`draftforge plot RUN_DIR [--out DIR]` runs this).

Writes into --out (default RUN_DIR/plots):
  loss.png              train loss and eval/loss over optimizer steps
  accuracy.png          train acc and eval/acc
  tau.png               simulated τ (accept_len of the training batches, eval/tau on the eval set) and, where
                        present, real τ from speculative decoding (eval/tau_real lines, or eval JSON files in
                        RUN_DIR holding "tau" and "tau_simulated", as `draftforge eval --spec-decode --out` writes)
  lr_grad_norm.png      learning rate and gradient norm (before clipping)
  per_position_acc.png  accuracy per block position at the last eval (and the last logged training step)
  moe_expert_load.png   MoE drafts: each MoE layer's expert load (share of routed slots) over steps, a heatmap
Needs matplotlib only.
"""

import argparse
import glob
import json
import math
import os
import sys


def read_metrics(path):
    train, evals = [], []
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                line = json.loads(raw)
            except ValueError:
                print(f"plot: {path}:{n}: not JSON, skipped", file=sys.stderr)
                continue
            if not isinstance(line.get("step"), int):
                continue
            (evals if any(k.startswith("eval/") for k in line) else train).append(line)
    return train, evals


def series(lines, key):
    pts = [(line["step"], line[key]) for line in lines if isinstance(line.get(key), (int, float))]
    pts = [(s, v) for s, v in pts if not isinstance(v, bool) and math.isfinite(v)]
    return [s for s, _ in pts], [v for _, v in pts]


def spec_decode_results(run_dir):
    """(label, τ) of the real-τ eval JSON files in run_dir."""
    out = []
    for path in sorted(glob.glob(os.path.join(run_dir, "*.json"))):
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("tau"), (int, float)) and "tau_simulated" in doc:
            out.append((os.path.basename(path), float(doc["tau"])))
    return out


class Charts:
    def __init__(self, out_dir, title):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        self.plt, self.out, self.title, self.written = plt, out_dir, title, []

    def save(self, fig, name):
        path = os.path.join(self.out, name)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        self.plt.close(fig)
        self.written.append(path)

    def lines(self, name, ylabel, curves, log_y=False, extra=None):
        fig, ax = self.plt.subplots(figsize=(8, 4.5))
        drawn = 0
        for label, (xs, ys), style in curves:
            if xs:
                ax.plot(xs, ys, style, label=label, markersize=4)
                drawn += 1
        if extra:
            drawn += extra(ax)
        if not drawn:
            ax.text(0.5, 0.5, "no data logged", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(ylabel)
        if log_y:
            ax.set_yscale("log")
        ax.set_title(f"{self.title}: {ylabel}")
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend()
        self.save(fig, name)


def plot_tau(c, run_dir, train, evals):
    real = spec_decode_results(run_dir)
    last_step = max((line["step"] for line in train + evals), default=0)

    def real_points(ax):
        for label, tau in real:
            ax.axhline(tau, color="tab:red", linestyle="--", label=f"real τ ({label})")
        return len(real)

    c.lines("tau.png", "τ (accepted tokens per block)",
            [("train batches, simulated", series(train, "accept_len"), "-"),
             ("eval, simulated", series(evals, "eval/tau"), "o-"),
             ("eval, real (speculative decoding)", series(evals, "eval/tau_real"), "s-")],
            extra=real_points)
    return last_step


def plot_lr_grad(c, train):
    fig, (a1, a2) = c.plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    xs, ys = series(train, "lr")
    a1.plot(xs, ys, "-", color="tab:green")
    a1.set_ylabel("learning rate")
    a1.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    xs, ys = series(train, "grad_norm")
    a2.plot(xs, ys, "-", color="tab:purple", label="grad norm")
    clip = [line.get("clip_coef") for line in train if isinstance(line.get("clip_coef"), float)]
    a2.set_ylabel("gradient norm (before clipping)")
    a2.set_xlabel("optimizer step")
    for a in (a1, a2):
        a.grid(alpha=0.3)
    clipped = sum(1 for x in clip if x < 1.0)
    a1.set_title(f"{c.title}: learning rate and gradient norm (clipped at {clipped} of {len(clip)} logged steps)")
    c.save(fig, "lr_grad_norm.png")


def plot_positions(c, train, evals):
    fig, ax = c.plt.subplots(figsize=(8, 4.5))
    drawn = 0
    for label, lines, key, offset in (("eval", evals, "eval/per_position_acc", -0.2),
                                      ("train batch", train, "per_position_acc", 0.2)):
        with_key = [line for line in lines if isinstance(line.get(key), list)]
        if not with_key:
            continue
        last = with_key[-1]
        pos = [(k, v) for k, v in enumerate(last[key]) if isinstance(v, (int, float))]
        ax.bar([k + offset for k, _ in pos], [v for _, v in pos], width=0.4, label=f"{label} @ step {last['step']}")
        ax.set_xticks([k for k, _ in pos])
        drawn += 1
    if not drawn:
        ax.text(0.5, 0.5, "no per-position accuracy logged", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.legend()
    ax.set_xlabel("position in the block (0 is the anchor)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.set_title(f"{c.title}: accuracy per block position")
    ax.grid(alpha=0.3, axis="y")
    c.save(fig, "per_position_acc.png")


def plot_moe(c, train):
    with_load = [line for line in train if isinstance(line.get("moe/expert_load"), dict)]
    if not with_load:
        return
    layers = sorted(with_load[0]["moe/expert_load"], key=int)
    steps = [line["step"] for line in with_load]
    fig, axes = c.plt.subplots(len(layers), 1, figsize=(8, 2.6 * len(layers) + 0.6), squeeze=False)
    for ax, layer in zip(axes[:, 0], layers):
        rows = [line["moe/expert_load"].get(layer) for line in with_load]
        E = max(len(r) for r in rows if r)
        grid = [[(r[e] if r and e < len(r) else float("nan")) for r in rows] for e in range(E)]  # (E, steps)
        im = ax.imshow(grid, aspect="auto", origin="lower", cmap="viridis", interpolation="nearest",
                       extent=(steps[0] - 0.5, steps[-1] + 0.5, -0.5, E - 0.5), vmin=0.0)
        ax.set_ylabel(f"layer {layer}\nexpert")
        fig.colorbar(im, ax=ax, label="share of slots")
    axes[-1, 0].set_xlabel("optimizer step")
    axes[0, 0].set_title(f"{c.title}: MoE expert load (uniform = 1/E)")
    c.save(fig, "moe_expert_load.png")


def main(argv=None):
    ap = argparse.ArgumentParser(description="PNG charts of a draftforge run")
    ap.add_argument("run_dir")
    ap.add_argument("--out", help="output directory (default RUN_DIR/plots)")
    args = ap.parse_args(argv)
    path = os.path.join(args.run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        print(f"error: {path} does not exist\n  HINT: pass a run directory (the recipe's output_dir)", file=sys.stderr)
        return 1
    train, evals = read_metrics(path)
    if not train and not evals:
        print(f"error: {path} has no logged step yet\n  HINT: plot after the first log_interval steps",
              file=sys.stderr)
        return 1
    out = args.out or os.path.join(args.run_dir, "plots")
    try:
        written = draw(out, args.run_dir, train, evals)
    except OSError as e:  # the charts' directory or a file in it cannot be written
        print(f"error: cannot write the charts to {out}: {e.strerror or e}\n"
              f"  HINT: pass a writable --out directory", file=sys.stderr)
        return 1
    for p in written:
        print(p)
    return 0


def draw(out, run_dir, train, evals):
    os.makedirs(out, exist_ok=True)
    c = Charts(out, os.path.basename(os.path.normpath(run_dir)))
    c.lines("loss.png", "loss", [("train", series(train, "loss"), "-"), ("eval", series(evals, "eval/loss"), "o-")])
    c.lines("accuracy.png", "accuracy",
            [("train", series(train, "acc"), "-"), ("eval", series(evals, "eval/acc"), "o-")])
    plot_tau(c, run_dir, train, evals)
    plot_lr_grad(c, train)
    plot_positions(c, train, evals)
    plot_moe(c, train)
    return c.written


if __name__ == "__main__":
    sys.exit(main())
