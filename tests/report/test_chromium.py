#!/usr/bin/env python3
"""zt-report's page in a real browser: headless Chromium loads it from disk (no network: the page needs
none), and what it shows is checked: --dump-dom gives the DOM after parsing, which must hold every
chart's title, its legend entries and axis labels; --screenshot must not be blank and must show the
series' colours (the inline SVG is drawn).

Chromium is Debian's `chromium` package (scripts/install-deps.sh). Without it this test fails, unless
ZT_SKIP_CHROMIUM=1 is set, when it skips (exit 77) saying so.

usage: test_chromium.py ZT_REPORT WORK_DIR
"""
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pngread  # noqa: E402
import test_report  # noqa: E402  (the known metrics files and the page parser)


def find_chromium():
    for name in (os.environ.get('ZT_CHROMIUM'), 'chromium', 'chromium-browser', 'google-chrome'):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def chromium(binary, profile, *args):
    cmd = [binary, '--headless', '--no-sandbox', '--disable-gpu', '--no-first-run', '--disable-extensions',
           '--disable-dev-shm-usage', f'--user-data-dir={profile}', *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    if p.returncode != 0:
        print(p.stderr[-3000:])
    return p


def main():
    zt_report, work = sys.argv[1], sys.argv[2]
    binary = find_chromium()
    if not binary:
        if os.environ.get('ZT_SKIP_CHROMIUM') == '1':
            print('SKIP: no chromium found and ZT_SKIP_CHROMIUM=1 (install Debian\'s chromium: scripts/install-deps.sh)')
            return 77
        print('FAIL: no chromium, chromium-browser or google-chrome on PATH (or ZT_CHROMIUM); install Debian\'s '
              'chromium package (scripts/install-deps.sh), or set ZT_SKIP_CHROMIUM=1 to skip this test')
        return 1
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    run_a, run_b, cmp_dir, _, _ = test_report.make_runs(work)
    out = os.path.join(work, 'report.html')
    # Run names are the directories as given: relative ones, so the legends' text does not depend on how
    # long the build's path is (a long one is shortened in the legend).
    dirs = [os.path.relpath(d, work) for d in (run_a, run_b, cmp_dir)]
    p = subprocess.run([zt_report, *dirs, '-o', out], capture_output=True, text=True, cwd=work)
    test_report.check(p.returncode == 0, f'zt-report exits 0: {p.stderr}')
    source = test_report.parse_page(out)
    check = test_report.check
    with tempfile.TemporaryDirectory() as profile:
        dom = chromium(binary, profile, '--dump-dom', 'file://' + out)
        check(dom.returncode == 0 and '</svg>' in dom.stdout, f'chromium --dump-dom exits 0 with the page (rc {dom.returncode})')
        page = test_report.Page()
        page.feed(dom.stdout)
        for c in source.data['charts']:
            svg = page.svgs.get('chart-' + c['id'])
            check(svg is not None, f'the rendered DOM has chart {c["id"]}')
            if svg is None:
                continue
            texts = svg['texts']
            check(('title', c['title']) in texts, f'{c["id"]}: the title {c["title"]!r} is shown')
            if c['series'] or c['rows']:
                check(('xlabel', c['xlabel']) in texts, f'{c["id"]}: the x axis label {c["xlabel"]!r} is shown')
                if c['ylabel']:
                    check(('ylabel', c['ylabel']) in texts, f'{c["id"]}: the y axis label {c["ylabel"]!r} is shown')
                names = [s['name'] for s in c['series']] or c['stacks']
                for n in names:
                    check(('legend', n) in texts, f'{c["id"]}: the legend names {n!r}')
            else:
                check(any(k == 'empty-note' for k, _ in texts), f'{c["id"]}: an empty chart says why')
        check(len(page.tables.get('summary', [[]])[0]) == 4, 'the rendered DOM has the summary of 3 runs')
        check(any(cell and 'does not fit' in cell for row in page.tables.get('compare', [[]])[0] for cell in row),
              'the rendered DOM has the comparison\'s does-not-fit row')

        shot = os.path.join(work, 'screenshot.png')
        p = chromium(binary, profile, '--window-size=1000,1600', '--hide-scrollbars', f'--screenshot={shot}',
                     'file://' + out)
        check(p.returncode == 0 and os.path.exists(shot), f'chromium --screenshot writes {shot}')
        if os.path.exists(shot):
            w, h, rows = pngread.read(shot)
            counts = {}
            for row in rows:
                for px in row:
                    counts[px] = counts.get(px, 0) + 1
            background = max(counts, key=counts.get)
            ink = w * h - counts[background]
            check(ink > 0.02 * w * h, f'the screenshot is not blank: {ink} of {w * h} pixels differ from the background')
            # The first series colour of the charts (the loss chart's first line) is on screen.
            blue = (0x1f, 0x77, 0xb4)
            near = sum(n for (r, g, b), n in counts.items() if abs(r - blue[0]) + abs(g - blue[1]) + abs(b - blue[2]) < 30)
            check(near > 200, f'the screenshot shows the charts\' lines ({near} pixels of the first series colour)')
    return 1 if test_report.failures else 0


if __name__ == '__main__':
    rc = main()
    print('ok' if rc == 0 else ('skipped' if rc == 77 else f'{len(test_report.failures)} check(s) failed'))
    sys.exit(rc)
