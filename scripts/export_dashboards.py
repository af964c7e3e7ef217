"""Writes a run's figures where teams look: a W&B run in offline mode (the W&B SDK) and
TensorBoard event files (tensorboardX). Called by `grpo-suite export` with the payload it
reads from the records (src/export.rs); nothing here reaches the network.

    python scripts/export_dashboards.py PAYLOAD.json [--wandb DIR] [--tensorboard DIR]
        [--project P] [--name N] [--tag T ...]

Prints one line per writer: where it wrote, and what.
"""

import argparse
import json
import math
import os
import sys

FIGURES = ("worst_over_bound", "peak_over_floor", "roofline_over_baseline", "median_s")
COLUMNS = ("name", "backend", "implementation", "case", "kind", "verdict", "reasons",
           "worst_over_bound", "worst_output", "peak_over_floor", "roofline_over_baseline",
           "median_s", "class_reached", "class_required", "reason")


def finite(x):
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def write_wandb(p, d, project, name, tags):
    os.environ["WANDB_MODE"] = "offline"
    os.environ["WANDB_SILENT"] = "true"
    os.environ.setdefault("WANDB_CONSOLE", "off")
    import wandb

    os.makedirs(d, exist_ok=True)
    run = wandb.init(project=project, name=name, tags=tags, config=p["config"], dir=d,
                     mode="offline", settings=wandb.Settings(console="off", x_disable_stats=True,
                                                             x_disable_meta=True))
    for t in p["trials"]:
        run.summary[t["name"]] = {k: v for k, v in t.items() if k != "name" and v is not None}
    table = wandb.Table(columns=list(COLUMNS),
                        data=[[",".join(t[c]) if c == "reasons" else t.get(c) for c in COLUMNS]
                              for t in p["trials"]])
    run.log({"trials": table})
    for s in p["trajectories"]:
        n = s["name"]
        run.define_metric(f"{n}/step")
        for m in ("drift", "bound", "loss", "loss_exact"):
            run.define_metric(f"{n}/{m}", step_metric=f"{n}/step")
        for i, step in enumerate(s["step"]):
            row = {f"{n}/step": step}
            for m in ("drift", "bound", "loss", "loss_exact"):
                if finite(s[m][i]):
                    row[f"{n}/{m}"] = s[m][i]
            run.log(row)
    where = run.dir
    run.finish()
    run_dir = os.path.dirname(where.rstrip("/"))
    print(f"wandb: offline run {run_dir} ({len(p['trials'])} trials, {len(p['trajectories'])} "
          f"trajectories); upload it with `wandb sync {run_dir}`")


def write_tensorboard(p, d):
    from tensorboardX import SummaryWriter

    w = SummaryWriter(logdir=d)
    w.add_text("run/config", "```\n" + json.dumps(p["config"], indent=1, sort_keys=True) + "\n```", 0)
    n = 0
    for t in p["trials"]:
        for f in FIGURES:
            if finite(t.get(f)):
                w.add_scalar(f"{t['name']}/{f}", t[f], 0)
                n += 1
        w.add_text(f"{t['name']}/verdict", t["verdict"] + (f": {t['reason']}" if t.get("reason") else ""), 0)
    for s in p["trajectories"]:
        for m in ("drift", "bound", "loss", "loss_exact"):
            for step, v in zip(s["step"], s[m]):
                if finite(v):
                    w.add_scalar(f"{s['name']}/{m}", v, step)
                    n += 1
    w.close()
    print(f"tensorboard: {d} ({n} scalars: {len(p['trials'])} trials, "
          f"{len(p['trajectories'])} trajectories as steps)")


def main(argv=None):
    a = argparse.ArgumentParser(prog="export_dashboards.py")
    a.add_argument("payload")
    a.add_argument("--wandb")
    a.add_argument("--tensorboard")
    a.add_argument("--project", default="grpo-conformance")
    a.add_argument("--name")
    a.add_argument("--tag", action="append", default=[])
    args = a.parse_args(argv)
    with open(args.payload) as f:
        p = json.load(f)
    if args.wandb:
        write_wandb(p, args.wandb, args.project, args.name, args.tag)
    if args.tensorboard:
        write_tensorboard(p, args.tensorboard)
    return 0


if __name__ == "__main__":
    sys.exit(main())
