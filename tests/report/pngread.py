"""A PNG reader written from the PNG specification with zlib and struct only: an independent decoder
for zt-report's PNGs (its own encoder) and Chromium's screenshots. Checks the signature, every
chunk's CRC and the zlib stream (zlib.decompress checks the Adler-32), undoes the five row filters,
and returns RGB pixels.
"""
import struct
import zlib

SIGNATURE = b'\x89PNG\r\n\x1a\n'


class PngError(Exception):
    pass


def _paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def read(path):
    """(width, height, rows) where rows[y][x] is an (r, g, b) tuple."""
    data = open(path, 'rb').read()
    if data[:8] != SIGNATURE:
        raise PngError(f'{path}: not a PNG signature')
    pos, idat, palette, header = 8, b'', None, None
    while pos < len(data):
        if pos + 8 > len(data):
            raise PngError(f'{path}: truncated chunk header at {pos}')
        length, ctype = struct.unpack('>I4s', data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        crc, = struct.unpack('>I', data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(ctype + body) & 0xffffffff != crc:
            raise PngError(f'{path}: bad CRC in chunk {ctype!r}')
        if ctype == b'IHDR':
            header = struct.unpack('>IIBBBBB', body)
        elif ctype == b'PLTE':
            palette = [tuple(body[i:i + 3]) for i in range(0, len(body), 3)]
        elif ctype == b'IDAT':
            idat += body
        elif ctype == b'IEND':
            break
        pos += 12 + length
    if header is None:
        raise PngError(f'{path}: no IHDR')
    w, h, depth, ctype, _, _, interlace = header
    if depth != 8 or interlace != 0 or ctype not in (0, 2, 3, 4, 6):
        raise PngError(f'{path}: unsupported PNG (depth {depth}, colour type {ctype}, interlace {interlace})')
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[ctype]
    raw = zlib.decompress(idat)
    stride = w * channels
    if len(raw) != h * (stride + 1):
        raise PngError(f'{path}: {len(raw)} bytes of image data, expected {h * (stride + 1)}')
    prev = bytearray(stride)
    rows = []
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                line[i] = (line[i] + _paeth(a, b, c)) & 255
            elif f != 0:
                raise PngError(f'{path}: row {y} has filter type {f}')
        prev = line
        if ctype == 3:
            if palette is None:
                raise PngError(f'{path}: palette image without PLTE')
            rows.append([palette[v] for v in line])
        elif ctype in (0, 4):
            rows.append([(line[x * channels],) * 3 for x in range(w)])
        else:
            rows.append([tuple(line[x * channels:x * channels + 3]) for x in range(w)])
    return w, h, rows
