"""libai.utils.tfevents against TensorBoard (the oracle here): the same bytes as its protos
serialize, the same record checksums, files its EventAccumulator reads back (scalars, steps, a
resume's SessionLog.START), and no TensorBoard import on the trainer's path."""
import os
import subprocess
import sys

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.proto.event_pb2 import Event, SessionLog, SourceMetadata
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as tb_masked_crc32c

from libai.utils import tfevents

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_crc32c_check_value_and_masking():
    assert tfevents.crc32c(b"123456789") == 0xE3069283  # the CRC-32C catalogue's check value
    rng = np.random.default_rng(0)
    for n in (0, 1, 8, 13, 100):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert tfevents.masked_crc32c(data) == tb_masked_crc32c(data)


@pytest.mark.parametrize("step", [0, 1, 127, 128, 2 ** 40, -3])
@pytest.mark.parametrize("scalars", [{"total_loss": 7.25}, {"lr": 0.0, "zé/Acc@1": -1.5e-8, "x" * 200: float("inf")}])
def test_scalar_events_serialize_as_tensorboards(step, scalars):
    want = Event(wall_time=1764460000.123456, step=step,
                 summary=Summary(value=[Summary.Value(tag=k, simple_value=v) for k, v in scalars.items()]))
    assert tfevents.encode_event(1764460000.123456, step, scalars=scalars) == want.SerializeToString()


def test_file_version_and_session_start_serialize_as_tensorboards():
    want = Event(wall_time=12.5, file_version="brain.Event:2", source_metadata=SourceMetadata(writer="w"))
    assert tfevents.encode_event(12.5, file_version="brain.Event:2", writer="w") == want.SerializeToString()
    want = Event(wall_time=12.5, step=40, session_log=SessionLog(status=SessionLog.START))
    assert tfevents.encode_event(12.5, 40, session_status=tfevents.SESSION_START) == want.SerializeToString()


def test_tensorboard_reads_the_file_and_honours_a_resume(tmp_path):
    w = tfevents.EventFileWriter(str(tmp_path / "logs"))
    for step in range(10):
        w.add_scalars({"loss": 10.0 - step, "lr": 0.1}, step)
    w.add_session_start(5)  # resumed at 5: TensorBoard drops the first attempt's steps >= 5
    for step in range(5, 8):
        w.add_scalars({"loss": 100.0 + step}, step)
    w.close()
    assert os.path.basename(w.path).startswith("events.out.tfevents.")
    acc = EventAccumulator(str(tmp_path / "logs"))
    acc.Reload()
    assert {"loss", "lr"} <= set(acc.Tags()["scalars"])
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == \
        [(s, 10.0 - s) for s in range(5)] + [(s, 100.0 + s) for s in range(5, 8)]
    assert [e.step for e in acc.Scalars("lr")] == list(range(5))


def test_the_trainers_writer_does_not_import_tensorboard(tmp_path):
    code = ("import sys\nfrom libai.utils.events import EventStorage, TensorboardXWriter\n"
            f"w = TensorboardXWriter({str(tmp_path)!r})\n"
            "with EventStorage(0) as s:\n    s.put_scalar('loss', 1.5)\n    w.write()\nw.close()\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'tensorboard'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(0, 1.5)]
