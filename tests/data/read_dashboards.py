"""Reads back what `grpo-suite export` wrote, with the writers' own readers: the W&B
offline run's transaction log through the SDK (wandb.sdk.internal.datastore) and the
TensorBoard event files through tbparse. Prints one JSON object (tests/export.rs).

    python tests/data/read_dashboards.py WANDB_DIR TB_DIR
"""

import glob
import json
import sys


def read_wandb(d):
    from wandb.proto import wandb_internal_pb2 as pb
    from wandb.sdk.internal import datastore

    [path] = glob.glob(f"{d}/wandb/offline-run-*/run-*.wandb")
    ds = datastore.DataStore()
    ds.open_for_scan(path)
    out = {"summary": {}, "history": [], "config": {}, "tags": [], "name": None, "project": None}
    while True:
        data = ds.scan_data()
        if data is None:
            break
        r = pb.Record()
        r.ParseFromString(data)
        kind = r.WhichOneof("record_type")
        key = lambda i: i.key or "/".join(i.nested_key)  # noqa: E731
        if kind == "run":
            out["name"], out["project"], out["tags"] = r.run.display_name, r.run.project, list(r.run.tags)
            for i in r.run.config.update:
                out["config"][key(i)] = json.loads(i.value_json)
        elif kind == "config":
            for i in r.config.update:
                out["config"][key(i)] = json.loads(i.value_json)
        elif kind == "summary":
            for i in r.summary.update:
                out["summary"][key(i)] = json.loads(i.value_json)
        elif kind == "history":
            out["history"].append({key(i): json.loads(i.value_json) for i in r.history.item})
    out["config"].pop("_wandb", None)
    return out


def read_tensorboard(d):
    from tbparse import SummaryReader

    df = SummaryReader(d).scalars
    out = {}
    for tag, step, value in zip(df["tag"], df["step"], df["value"]):
        out.setdefault(tag, []).append([int(step), float(value)])
    return out


print(json.dumps({"wandb": read_wandb(sys.argv[1]), "tensorboard": read_tensorboard(sys.argv[2])}))
