"""The files the attacks send, each one new to the server (so no cache answers it)."""

from __future__ import annotations

import io
import struct
import uuid
import zipfile
import zlib
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
CAT = ROOT / "examples" / "cat_chelsea.jpg"
SIDE = 7063  # 49.9 MP


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


class Inputs:
    """The files the attacks send, in a temporary folder; each ``unique_*`` call gives a file never sent before."""

    def __init__(self, folder: Path) -> None:
        self.folder, self._n = folder, 0
        buf = io.BytesIO()
        Image.new("RGB", (SIDE, SIDE), (200, 30, 60)).save(buf, "PNG")
        self.big = buf.getvalue()  # one colour: 161 KB that decode to 49.9 MP
        self.cat = CAT.read_bytes()

    def _write(self, data: bytes, suffix: str) -> Path:
        self._n += 1
        path = self.folder / f"f{self._n:05d}{suffix}"
        path.write_bytes(data)
        return path

    def unique_big(self) -> Path:
        """The 49.9 MP PNG with a text chunk of its own before IEND: same pixels, new file."""
        text = _png_chunk(b"tEXt", b"Comment\x00" + uuid.uuid4().hex.encode())
        return self._write(self.big[:-12] + text + self.big[-12:], ".png")

    def unique_cat(self) -> Path:
        """The cat photo with a JPEG comment of its own after SOI."""
        comment = uuid.uuid4().hex.encode()
        return self._write(
            self.cat[:2] + b"\xff\xfe" + struct.pack(">H", len(comment) + 2) + comment + self.cat[2:], ".jpg"
        )

    def zip_of_big(self, n: int) -> Path:
        path = self.folder / f"big{n}-{uuid.uuid4().hex[:6]}.zip"
        with zipfile.ZipFile(path, "w") as z:
            for i in range(n):
                z.writestr(f"img{i:02d}.png", self.unique_big().read_bytes())
        return path

    def zip_of_entries(self, n: int, declared: int | None = None) -> Path:
        """A zip of ``n`` empty entries named with 6 digits, ZIP64 end records (over 65,535 entries) that
        declare ``declared`` entries (default ``n``: the truth)."""
        declared = n if declared is None else declared
        local, central = struct.Struct("<4s5H3L2H"), struct.Struct("<4s6H3L5H2L")
        out = bytearray()
        directory = bytearray()
        for i in range(n):
            name = f"{i:06d}".encode()
            offset = len(out)
            out += local.pack(b"PK\x03\x04", 20, 0, 0, 0, 0x21, 0, 0, 0, len(name), 0) + name
            directory += central.pack(b"PK\x01\x02", 20, 20, 0, 0, 0, 0x21, 0, 0, 0, len(name), 0, 0, 0, 0, 0, offset)
            directory += name
        start, size = len(out), len(directory)
        out += directory
        record = len(out)
        out += struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, declared, declared, size, start)
        out += struct.pack("<4sLQL", b"PK\x06\x07", 0, record, 1)
        out += struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
        return self._write(bytes(out), ".zip")
