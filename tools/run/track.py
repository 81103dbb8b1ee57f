#!/usr/bin/env python3
"""Forward a draftforge run's metrics.jsonl to an experiment tracker (wandb, swanlab or mlflow).

`draftforge train` starts this script when `tracking.report_to` names a tracker, with stdin a pipe it holds:
the script follows metrics.jsonl as lines are appended, and when stdin reaches end-of-file (the trainer ended,
normally or not) it forwards what is left and finishes the tracker's run. It can also be run by hand on a
finished run (stdin from /dev/null: one pass, then finish):

    python3 tools/run/track.py --backend wandb --run-dir runs/demo-dflash --offline </dev/null

The tracker's run id is kept in <run-dir>/tracking/<backend>-run.json, so a resumed training continues the
same tracker run; lines at or below --from-step (the checkpoint it resumed from) were sent before.
Configuration: the resolved recipe (<run-dir>/recipe.resolved.yaml) flattened to "section.key" entries, API
keys left out. Only the standard library is needed besides the tracker package (and PyYAML for the config,
which every supported tracker installs).
"""

import argparse
import json
import os
import select
import signal
import sys
import time

SECRET_KEYS = ("wandb_key", "swanlab_key")


def load_config(run_dir):
    """The resolved recipe as a flat {"section.key": value} dict ({} when it cannot be read)."""
    path = os.path.join(run_dir, "recipe.resolved.yaml")
    try:
        import yaml  # noqa: PLC0415 (optional)

        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f) or {}
    except (ImportError, OSError, ValueError) as e:
        print(f"track.py: config not logged ({path}: {e})", file=sys.stderr)
        return {}
    flat = {}

    def walk(prefix, node):
        for k, v in node.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict):
                walk(key + ".", v)
            elif k not in SECRET_KEYS:
                flat[key] = v

    walk("", doc)
    return flat


def numbers(line):
    """The numeric entries of one metrics line: numbers and booleans as they are, lists of numbers as
    "<key>/<index>", moe/expert_load {layer: [share, ...]} as "moe/expert_load/layer_<L>/<expert>"."""
    out = {}
    for k, v in line.items():
        if k == "step":
            continue
        if isinstance(v, bool):
            out[k] = int(v)
        elif isinstance(v, (int, float)):
            out[k] = v
        elif isinstance(v, list):
            for i, x in enumerate(v):
                if isinstance(x, (int, float)) and not isinstance(x, bool):
                    out[f"{k}/{i}"] = x
        elif isinstance(v, dict) and k == "moe/expert_load":
            for layer, shares in v.items():
                for e, x in enumerate(shares):
                    if isinstance(x, (int, float)):
                        out[f"{k}/layer_{layer}/{e}"] = x
    return out


class Follower:
    """Reads whole lines appended to a file, tolerating a file that does not exist yet or is replaced
    (a resumed run rewrites metrics.jsonl once, at start-up, before the trainer starts this script)."""

    def __init__(self, path):
        self.path, self.pos, self.partial = path, 0, b""

    def read(self):
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except FileNotFoundError:
            return []
        self.pos += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()  # an unfinished last line waits for its newline
        out = []
        for raw in lines:
            if raw.strip():
                try:
                    out.append(json.loads(raw))
                except ValueError:
                    print(f"track.py: skipping a malformed line of {self.path}", file=sys.stderr)
        return out


# ---- backends: start(args, config) -> run; run.log(dict, step); run.finish() ---------------------------------


class WandbRun:
    def __init__(self, args, config, resume_id):
        import wandb  # noqa: PLC0415

        if args.offline:
            os.environ["WANDB_MODE"] = "offline"
        os.makedirs(args.dir, exist_ok=True)
        kw = dict(project=args.project, name=args.name, config=config, dir=args.dir)
        if resume_id:
            kw.update(id=resume_id, resume="allow")
        self.wandb = wandb
        self.run = wandb.init(**kw)
        self.id = self.run.id

    def log(self, values, step):
        self.run.log(values, step=step)

    def finish(self):
        self.run.finish()


class SwanlabRun:
    def __init__(self, args, config, resume_id):
        import swanlab  # noqa: PLC0415

        kw = dict(project=args.project, experiment_name=args.name, config=config, logdir=args.dir)
        if args.offline:
            kw["mode"] = "offline"
        if resume_id:
            kw.update(id=resume_id, resume="allow")
        self.swanlab = swanlab
        self.run = swanlab.init(**kw)
        self.id = getattr(self.run, "id", None) or getattr(getattr(self.run, "public", None), "run_id", None)

    def log(self, values, step):
        self.swanlab.log(values, step=step)

    def finish(self):
        self.swanlab.finish()


class MlflowRun:
    def __init__(self, args, config, resume_id):
        import mlflow  # noqa: PLC0415

        self.mlflow = mlflow
        if args.tracking_uri:
            mlflow.set_tracking_uri(args.tracking_uri)
        if args.project:
            mlflow.set_experiment(args.project)
        run = mlflow.start_run(run_id=resume_id) if resume_id else mlflow.start_run(run_name=args.name)
        self.id = run.info.run_id
        if not resume_id:  # parameters are write-once in mlflow
            mlflow.log_params({k: str(v)[:500] for k, v in config.items()})

    def log(self, values, step):
        # mlflow keys: alphanumerics, _ - . / and spaces
        self.mlflow.log_metrics({k.replace(":", "_"): float(v) for k, v in values.items()}, step=step)

    def finish(self):
        self.mlflow.end_run()


BACKENDS = {"wandb": WandbRun, "swanlab": SwanlabRun, "mlflow": MlflowRun}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", required=True, choices=sorted(BACKENDS))
    ap.add_argument("--run-dir", required=True, help="the run's output_dir (holds metrics.jsonl)")
    ap.add_argument("--from-step", type=int, default=0, help="skip lines at or below this step (resume)")
    ap.add_argument("--project", help="wandb/swanlab project, mlflow experiment")
    ap.add_argument("--name", help="the tracker's run name")
    ap.add_argument("--dir", help="where the tracker writes local files (default: --run-dir)")
    ap.add_argument("--offline", action="store_true", help="wandb/swanlab offline mode")
    ap.add_argument("--tracking-uri", help="mlflow tracking URI")
    ap.add_argument("--poll", type=float, default=0.5, help="seconds between reads of metrics.jsonl")
    args = ap.parse_args(argv)
    args.dir = args.dir or args.run_dir

    # Ctrl-C reaches the whole process group: the trainer finishes its step and checkpoints, and this script
    # must outlive it to forward the last lines; end-of-file on stdin is its signal. SIGTERM means the same.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))

    state_dir = os.path.join(args.run_dir, "tracking")
    os.makedirs(state_dir, exist_ok=True)
    state_path = os.path.join(state_dir, f"{args.backend}-run.json")
    resume_id = None
    if args.from_step > 0 and os.path.exists(state_path):
        with open(state_path, encoding="utf-8") as f:
            resume_id = json.load(f).get("id")

    run = BACKENDS[args.backend](args, load_config(args.run_dir), resume_id)
    if run.id:
        with open(state_path + ".tmp", "w", encoding="utf-8") as f:
            json.dump({"backend": args.backend, "id": run.id}, f)
        os.replace(state_path + ".tmp", state_path)

    follower = Follower(os.path.join(args.run_dir, "metrics.jsonl"))
    sent = 0

    def forward():
        nonlocal sent
        for line in follower.read():
            step = line.get("step")
            if not isinstance(step, int) or step <= args.from_step:
                continue
            values = numbers(line)
            if values:
                run.log(values, step)
                sent += 1

    stdin_open = True
    while stdin_open and not stop["now"]:
        forward()
        ready, _, _ = select.select([sys.stdin], [], [], args.poll)
        if ready and not sys.stdin.buffer.read1(4096):
            stdin_open = False
    forward()  # what the trainer wrote before it closed the pipe
    run.finish()
    print(f"track.py: {args.backend}: {sent} lines forwarded from {follower.path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
