"""Checks a headless-browser screenshot of ddptrain's report (report.html) pixel by pixel.

The page gives each figure's box on the page (data-box), its plot area and legend box inside
it (data-plot, data-legend) and the colours of its curves (data-colors). In the screenshot:
  - the image is not blank: many distinct colours, and most of each figure's box is the white
    of a drawn chart (it rendered where the page says);
  - inside each plot area, away from its frame and its legend, every curve's colour is present
    in at least MIN_PIXELS pixels (a curve, not just a legend swatch).
PNG decoding is done here (zlib + the five PNG filters), so the test needs no imaging library.
Usage: check_report_png.py SCREENSHOT.png REPORT.html"""
import re
import struct
import sys
import zlib

MIN_PIXELS = 60
TOL = 12  # per channel: anti-aliasing at a curve's edge is not counted, its core is


def read_png(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    off, idat, w = 8, b"", None
    while off < len(data):
        (n,) = struct.unpack(">I", data[off:off + 4])
        kind, body = data[off + 4:off + 8], data[off + 8:off + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and ctype in (2, 6) and interlace == 0, f"PNG type {depth}/{ctype}"
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        off += 12 + n
    raw, stride = zlib.decompress(idat), w * bpp
    # Up (2) as whole-row integer arithmetic; Sub, Average and Paeth, whose bytes depend on the
    # one decoded before, byte by byte, each in a loop of its own (the checker's two calls took
    # 10 s of CPU, most of integration.report's time; 4 s now)
    lo, hi = int.from_bytes(b"\x7f" * stride, "big"), int.from_bytes(b"\x80" * stride, "big")
    rows, prev = [], bytearray(stride)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 255
        elif f == 2:  # bytewise sum mod 256 of two rows: 7-bit sums, then the top bits' xor
            x, p = int.from_bytes(line, "big"), int.from_bytes(prev, "big")
            line = bytearray((((x & lo) + (p & lo)) ^ ((x ^ p) & hi)).to_bytes(stride, "big"))
        elif f == 3:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + (a + prev[i]) // 2) & 255
        elif f == 4:
            for i in range(bpp):
                line[i] = (line[i] + prev[i]) & 255  # a = c = 0: Paeth gives b
            for i in range(bpp, stride):
                a, b, c = line[i - bpp], prev[i], prev[i - bpp]
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, bpp, rows


def main():
    png, html = sys.argv[1:3]
    w, h, bpp, rows = read_png(png)
    px = lambda x, y: tuple(rows[y][x * bpp:x * bpp + 3])
    page = open(html).read()
    figs = re.findall(r'<figure[^>]*data-box="(\d+) (\d+) (\d+) (\d+)" data-plot="(\d+) (\d+) '
                      r'(\d+) (\d+)" data-legend="(-?\d+) (-?\d+) (\d+) (\d+)" '
                      r'data-colors="([^"]*)"', page)
    failed = []
    if len(figs) < 6:
        failed.append(f"{len(figs)} figures in the page, want at least 6")
    colours = {px(x, y) for y in range(0, h, 3) for x in range(0, w, 3)}
    if len(colours) < 50:
        failed.append(f"the screenshot looks blank: {len(colours)} distinct colours")
    for i, f in enumerate(figs):
        bx, by, bw, bh, ax, ay, aw, ah, lx, ly, lw, lh = map(int, f[:12])
        if bx + bw > w or by + bh > h:
            failed.append(f"figure {i} at {bx},{by} {bw}x{bh} lies outside the {w}x{h} screenshot")
            continue
        box = [px(x, y) for y in range(by, by + bh, 2) for x in range(bx, bx + bw, 2)]
        white = sum(p == (255, 255, 255) for p in box) / len(box)
        if white < 0.5:
            failed.append(f"figure {i}: only {white:.0%} of its box is white: not drawn there?")
        want = [tuple(int(c[k:k + 2], 16) for k in (1, 3, 5)) for c in f[12].split()]
        count = [0] * len(want)
        for y in range(by + ay + 2, by + ay + ah - 2):
            row, legend_row = rows[y], ly - 2 <= y - by <= ly + lh + 2
            for x in range(bx + ax + 2, bx + ax + aw - 2):
                if legend_row and lx - 2 <= x - bx <= lx + lw + 2:
                    continue  # the legend's swatches do not count
                r, g, b = row[x * bpp], row[x * bpp + 1], row[x * bpp + 2]
                for k, (cr, cg, cb) in enumerate(want):
                    if abs(r - cr) <= TOL and abs(g - cg) <= TOL and abs(b - cb) <= TOL:
                        count[k] += 1
        for c, n in zip(f[12].split(), count):
            if n < MIN_PIXELS:
                failed.append(f"figure {i}: curve colour {c} in {n} pixels of its plot area "
                              f"(want ≥ {MIN_PIXELS})")
        print(f"figure {i}: {white:.0%} white, curve pixels " +
              ", ".join(f"{c} {n}" for c, n in zip(f[12].split(), count)))
    for m in failed:
        print("FAIL:", m)
    print(f"{w}x{h} screenshot, {len(colours)} colours, {len(figs)} figures: "
          f"{'FAILED' if failed else 'ok'}")
    sys.exit(1 if failed else 0)


main()
