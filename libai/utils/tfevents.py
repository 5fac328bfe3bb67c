"""TensorBoard event files, written without importing TensorBoard.

An event file is a sequence of TFRecords (length, masked CRC-32C of the length, data, masked
CRC-32C of the data), each holding one serialized `tensorboard.Event` protocol buffer. The
trainer writes only three kinds of event: the file version, scalars (v1 `Summary` with
`simple_value`) and the `SessionLog.START` marker of a resume, so they are encoded here by hand,
byte for byte as protobuf serializes them (tests/training/test_tfevents.py compares with
TensorBoard's own protos and reads the files back with its `EventAccumulator`). The reason is
start-up time: importing TensorBoard's writer and protos costs ~0.45 s in every training
process, more than a tiny training run's steps.
"""
import itertools
import os
import socket
import struct
import time

__all__ = ["EventFileWriter", "crc32c", "masked_crc32c", "encode_event"]


def _crc32c_table():
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli, reflected
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
    """TFRecord's masked CRC: the CRC rotated right by 15 bits plus a constant."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# ------------------------------------------------------------------ protobuf wire format
def _varint(n):
    n &= (1 << 64) - 1  # int64: a negative value is its 64-bit two's complement (10 bytes)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _key(field, wire_type):
    return _varint(field << 3 | wire_type)


def _message(field, payload):
    return _key(field, 2) + _varint(len(payload)) + payload


def _string(field, text):
    return _message(field, text.encode("utf-8"))


SESSION_START = 1  # SessionLog.SessionStatus.START


def encode_event(wall_time, step=0, file_version=None, scalars=None, session_status=None, writer=None):
    """A serialized `Event`: at most one of `file_version`, `scalars` ({tag: value}, one
    `Summary.Value` each) and `session_status`. Fields hold proto3's rules: a zero `wall_time`
    or `step` is left out; a member of the `what` oneof is written even when empty."""
    out = b""
    if wall_time:
        out += _key(1, 1) + struct.pack("<d", wall_time)  # double wall_time = 1
    if step:
        out += _key(2, 0) + _varint(int(step))  # int64 step = 2
    if file_version is not None:
        out += _string(3, file_version)  # string file_version = 3
    if scalars is not None:  # Summary summary = 5 { repeated Value value = 1 }
        values = b"".join(_message(1, _string(1, tag) + _key(2, 5) + struct.pack("<f", value))
                          for tag, value in scalars.items())  # string tag = 1; float simple_value = 2
        out += _message(5, values)
    if session_status is not None:  # SessionLog session_log = 7 { SessionStatus status = 1 }
        out += _message(7, (_key(1, 0) + _varint(session_status)) if session_status else b"")
    if writer is not None:  # SourceMetadata source_metadata = 10 { string writer = 1 }
        out += _message(10, _string(1, writer))
    return out


_uid = itertools.count()


class EventFileWriter:
    """One event file in `log_dir`, named as TensorBoard names its own
    (events.out.tfevents.<time>.<host>.<pid>.<n>), opened with its file-version event. Events are
    buffered and written out by `flush()`, and at the latest `flush_secs` after the last flush."""

    def __init__(self, log_dir, flush_secs=10, filename_suffix=""):
        os.makedirs(log_dir, exist_ok=True)
        name = "events.out.tfevents.%010d.%s.%s.%s" % (time.time(), socket.gethostname(), os.getpid(), next(_uid))
        self.path = os.path.join(log_dir, name + filename_suffix)
        self._file = open(self.path, "wb")
        self._flush_secs = flush_secs
        self._last_flush = time.monotonic()
        self.add_event(encode_event(time.time(), file_version="brain.Event:2", writer="libai.utils.tfevents"))
        self.flush()

    def add_event(self, event):
        """Append one serialized Event (see `encode_event`)."""
        header = struct.pack("<Q", len(event))
        self._file.write(header + struct.pack("<I", masked_crc32c(header)) + event
                         + struct.pack("<I", masked_crc32c(event)))
        if time.monotonic() - self._last_flush >= self._flush_secs:
            self.flush()

    def add_scalars(self, scalars, step, wall_time=None):
        self.add_event(encode_event(time.time() if wall_time is None else wall_time, step, scalars=scalars))

    def add_session_start(self, step, wall_time=None):
        self.add_event(encode_event(time.time() if wall_time is None else wall_time, step,
                                    session_status=SESSION_START))

    def flush(self):
        self._file.flush()
        self._last_flush = time.monotonic()

    def close(self):
        if not self._file.closed:
            self.flush()
            self._file.close()
