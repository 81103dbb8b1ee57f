"""tracking.report_to: tensorboard — the event files draftforge writes (protobuf-c records, CRC-32C framing),
read back with TensorBoard's own loader (EventAccumulator, which checks both CRCs of every record), must hold
every number of metrics.jsonl at its step: train scalars, eval metrics, per-position accuracy, MoE load."""

import glob
import math
import os

from conftest import metrics, train
from tensorboard.backend.event_processing import event_accumulator

# float32 in the file, double in metrics.jsonl
REL = 1e-6


def load(run_dir):
    files = glob.glob(os.path.join(run_dir, "tensorboard", "events.out.tfevents.*"))
    assert files, f"no event file under {run_dir}/tensorboard"
    acc = event_accumulator.EventAccumulator(
        os.path.join(run_dir, "tensorboard"),
        size_guidance={event_accumulator.SCALARS: 0, event_accumulator.HISTOGRAMS: 0, event_accumulator.TENSORS: 0},
    )
    acc.Reload()
    return acc, files


def expected_scalars(lines):
    """{tag: [(step, value), ...]} in file order, as the writer's documented mapping says (train/observe/tb_writer.h).
    A train line and an eval line of the same step both carry "epoch": two points at that step."""
    want = {}

    def put(tag, step, x):
        want.setdefault(tag, []).append((step, float(x)))

    for line in lines:
        step = line["step"]
        for k, v in line.items():
            if k == "step" or v is None or isinstance(v, str):
                continue
            if isinstance(v, (bool, int, float)):
                put(k, step, v)
            elif isinstance(v, list):
                for i, x in enumerate(v):
                    if isinstance(x, (int, float)):
                        put(f"{k}/{i}", step, x)
            elif k == "moe/expert_load":
                for layer, shares in v.items():
                    E = len(shares)
                    put(f"moe/layer_{layer}/load_max_ratio", step, max(shares) * E)
                    put(f"moe/layer_{layer}/load_min_ratio", step, min(shares) * E)
    return want


def check_scalars(acc, lines):
    want = expected_scalars(lines)
    got_tags = set(acc.Tags()["scalars"])
    assert got_tags == set(want), f"missing {set(want) - got_tags}, unexpected {got_tags - set(want)}"
    for tag, points in want.items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in points], f"{tag}: steps {got} != {points}"
        for (step, value), (_, ref) in zip(got, points):
            assert math.isclose(value, ref, rel_tol=REL, abs_tol=1e-30), (tag, step, value, ref)


def test_every_metric_reads_back(tmp_path):
    run = tmp_path / "run"
    train(run, "tracking.report_to=tensorboard", "training.max_steps=40", "training.log_interval=10",
          "training.eval_interval=20")
    lines = metrics(run)
    assert any("eval/tau" in line for line in lines) and any("per_position_acc" in line for line in lines)
    acc, files = load(run)
    assert len(files) == 1
    check_scalars(acc, lines)
    # the eval lines' per-position accuracy (position 0 is the anchor: null, so no scalar)
    assert "eval/per_position_acc/1" in acc.Tags()["scalars"]
    assert "eval/per_position_acc/0" not in acc.Tags()["scalars"]
    # the resolved recipe in the Text tab
    assert "recipe" in acc.Tags()["tensors"]
    text = acc.Tensors("recipe")[0].tensor_proto.string_val[0].decode()
    assert "run_id:" in text and "report_to: \"tensorboard\"" in text.replace("'", '"'), text[:400]


def test_resume_drops_orphaned_steps(tmp_path):
    """A run stopped at 40 and resumed from its step-20 checkpoint logs 21..40 again: the second file's
    SessionLog START makes TensorBoard drop the first file's steps past 20, so each step appears once."""
    run = tmp_path / "run"
    common = ["tracking.report_to=tensorboard", "training.total_steps=60", "training.log_interval=10",
              "training.save_interval=20"]
    train(run, *common, "training.max_steps=40")
    train(run, *common, "training.max_steps=60", extra=["--resume", run / "checkpoints" / "step-00000020"])
    lines = metrics(run)  # rewound to 20 on resume, so one line per step
    assert [line["step"] for line in lines] == [10, 20, 30, 40, 50, 60]
    acc, files = load(run)
    assert len(files) == 2
    loss_steps = [e.step for e in acc.Scalars("loss")]
    assert loss_steps == [10, 20, 30, 40, 50, 60], loss_steps
    check_scalars(acc, lines)


def test_moe_expert_load_per_layer(tmp_path):
    run = tmp_path / "run"
    train(run, "tracking.report_to=tensorboard", "training.max_steps=20", "training.log_interval=10",
          "training.eval_interval=0", recipe="recipes/demo-dflash-moe.yaml")
    lines = metrics(run)
    loads = [line["moe/expert_load"] for line in lines if "moe/expert_load" in line]
    assert len(loads) == 2 and sorted(loads[0]) == ["0", "1"]  # both decoder layers are MoE
    for per_layer in loads:
        for shares in per_layer.values():
            assert len(shares) == 8 and math.isclose(sum(shares), 1.0, rel_tol=1e-9)
    acc, _ = load(run)
    check_scalars(acc, lines)
    for layer in ("0", "1"):
        hist = acc.Histograms(f"moe/expert_load/layer_{layer}")
        assert [h.step for h in hist] == [10, 20]
        for h, line in zip(hist, [line for line in lines if "moe/expert_load" in line]):
            shares = line["moe/expert_load"][layer]
            v = h.histogram_value
            assert list(v.bucket_limit) == [e + 0.5 for e in range(8)]
            assert all(math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15) for a, b in zip(v.bucket, shares))
            assert math.isclose(v.num, sum(shares), rel_tol=1e-12)


def test_record_framing_checked_by_reader(tmp_path):
    """Every record passes TensorBoard's record reader (length CRC and data CRC); flipping one payload byte
    makes it fail the data CRC, so the reader really checks what draftforge wrote."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow

    run = tmp_path / "run"
    train(run, "tracking.report_to=tensorboard", "training.max_steps=10", "training.log_interval=5")
    (path,) = glob.glob(os.path.join(run, "tensorboard", "events.out.tfevents.*"))

    def records(p):
        r, out = pywrap_tensorflow.PyRecordReader_New(p), []
        while True:
            try:
                r.GetNext()
            except errors.OutOfRangeError:
                return out
            out.append(r.record())

    recs = records(path)
    first = event_pb2.Event.FromString(recs[0])
    assert first.file_version == "brain.Event:2"
    steps = [event_pb2.Event.FromString(b).step for b in recs[1:]]
    assert steps == [0, 5, 10]  # the recipe text, then one event per metrics line
    data = bytearray(open(path, "rb").read())
    data[12 + len(recs[0]) + 4 + 12 + 3] ^= 0x01  # a byte inside the second record's payload
    bad = tmp_path / "events.out.tfevents.bad"
    bad.write_bytes(bytes(data))
    try:
        records(str(bad))
    except errors.DataLossError as e:
        assert "crc" in str(e).lower()
    else:
        raise AssertionError("a corrupted record passed the CRC check")
