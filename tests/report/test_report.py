#!/usr/bin/env python3
"""zt-report's page against metrics files this test writes itself (not zt's writer): the series in the
page's JSON data block and the SVG paths are the values written (the paths mapped back through the
axis ranges the SVG carries), the PNGs decode with an independent reader (pngread.py) and have the
series' colour where the lines are, the summary, config and comparison tables say what the files
say, and bad inputs are clear errors with a non-zero exit that leave an old page as it was.

usage: test_report.py ZT_REPORT WORK_DIR
"""
import html.parser
import json
import math
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pngread  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print('FAIL:', what)


POOLS = ['params', 'grads', 'optimizer', 'activations', 'workspace', 'comm', 'kv_cache', 'other']
MiB = 1024.0 * 1024.0


def mem(step, rank, scale):
    pools = {}
    for i, p in enumerate(POOLS):
        peak = 0 if p == 'kv_cache' else int(scale * MiB * (i + 1) * (1 + 0.01 * step) * (1 + 0.37 * rank))
        pools[p] = {'current': peak // 2, 'peak': peak}
    pools['total'] = {'current': sum(v['current'] for v in pools.values()),
                      'peak': sum(v['peak'] for v in pools.values())}
    return pools


def train_record(step, total, rank=0, fp16=False, device=False, comm=False):
    """A record of run A (total 12) or B (total 20): the two runs' values differ everywhere, so no line
    hides another in the PNGs."""
    b = 1.0 if total == 20 else 0.0
    r = {'step': step, 'type': 'train', 'total_steps': total,
         'loss': 5.0 * math.exp(-step / 6.0) + 1.0 + 0.1 * rank + 0.7 * b,
         'lr': 1e-3 * step / total, 'grad_norm': 2.0 + math.sin(step) + 1.5 * b,
         'skipped': False, 'tokens': 1000 + 10 * step, 'loss_tokens': 600}
    if fp16:
        r['loss_scale'] = 65536.0 / (2 ** (step // 5))
    r['tokens_per_s'] = 5000.0 + 100 * step - 2000 * b
    r['step_s'] = r['tokens'] / r['tokens_per_s']
    r['elapsed_s'] = 0.2 * step
    r['eta_s'] = 0.2 * (total - step)
    r['mem_host'] = mem(step, rank, 1.0 + 0.55 * b)
    if device:
        r['mem_device'] = mem(step, rank, 40.0)
    if comm:
        ops = comm_ops(step, rank, 2)
        t = sum(o['time_s'] for o in ops)
        r['comm'] = {'time_s': t, 'share': t / r['step_s']}
        if step != 5 or rank != 0:  # a record without "ops" (a reader must accept it) is summed as none
            r['comm']['ops'] = ops
    return r


def comm_ops(step, rank, n):
    """A step's "comm"."ops" on n ranks: the kinds the ZeRO plugins use, bytes and times that differ per
    step, rank and kind; all_gather only from step 3 and a broadcast on "world" at step 7, so the
    order of first use is not the order of every record."""
    kinds = [('all_reduce', 'dp', 2, 40), ('reduce_scatter', 'dp', 20, 675840 * n)]
    if step >= 3:
        kinds.insert(0, ('all_gather', 'dp', 14, 353296 * n))
    if step == 7:
        kinds.append(('broadcast', 'world', 1, 8))
    ops = []
    for i, (op, group, count, nbytes) in enumerate(kinds):
        t = (0.0003 + 0.00011 * step + 0.00007 * rank) * (i + 1) * (1 + 0.013 * step)
        ops.append({'op': op, 'group': group, 'ranks': n, 'count': count, 'bytes': nbytes * (1 + step % 3),
                    'time_s': t, 'algbw_gbps': nbytes / t / 1e9, 'busbw_gbps': 0.0})
    return ops


def write_lines(path, records, torn=None):
    with open(path, 'w') as f:
        for r in records:
            f.write(json.dumps(r) + '\n')
        if torn:
            f.write(torn)


def make_runs(work):
    run_a = os.path.join(work, 'runA')
    run_b = os.path.join(work, 'runB')
    cmp_dir = os.path.join(work, 'cmp')
    for d in (run_a, run_b, cmp_dir):
        os.makedirs(d)
    recs = []
    for s in range(1, 13):
        recs.append(train_record(s, 12, fp16=True, device=True, comm=True))
        if s % 4 == 0:
            recs.append({'step': s, 'type': 'eval', 'eval_loss': 3.0 - 0.1 * s, 'eval_tokens': 500, 'eval_s': 0.1})
    recs.append({'step': 12, 'type': 'checkpoint_note', 'anything': 1})  # a type zt-report does not plot
    write_lines(os.path.join(run_a, 'metrics.jsonl'), recs)
    write_lines(os.path.join(run_a, 'metrics.rank1.jsonl'),
                [train_record(s, 12, rank=1, fp16=True, device=True, comm=True) for s in range(1, 13)])
    config = {'device': 'cuda', 'steps': 12, 'zero_optimization': {'stage': 2}, 'seed': 0,
              '_sources': {'device': '--set', 'steps': '--set', 'zero_optimization.stage': '--set',
                           'seed': 'default'},
              '_plugins': {'model': 'llama'}}
    with open(os.path.join(run_a, 'config.resolved.json'), 'w') as f:
        json.dump(config, f)
    # runB: half way through, no GPU, no communication monitor, a torn last line being written
    write_lines(os.path.join(run_b, 'metrics.jsonl'), [train_record(s, 20) for s in range(1, 11)],
                torn='{"step":11,"type":"train","total_st')
    compare = {'version': 1, 'keys': ['zero_optimization.stage', 'zero_optimization.offload_optimizer.device'],
               'rows': []}
    for i, (stage, off, fits) in enumerate([('1', 'none', True), ('3', 'cpu', True), ('0', 'none', False)]):
        est = {'device': {p: (i + 1) * 100 * MiB for p in POOLS[:4]},
               'host': {p: (i + 1) * 10 * MiB for p in POOLS[:4]}}
        for side in est.values():
            side['total'] = sum(side.values())
        row = {'config': {'zero_optimization.stage': stage, 'zero_optimization.offload_optimizer.device': off},
               'fits': fits, 'overflow': None if fits else 'device: the optimizer state needs 12 GiB more',
               'estimate': est, 'run_dir': os.path.join(cmp_dir, 'runs', str(i))}
        if fits:
            meas = {'device': {p: (i + 1) * 90 * MiB + k * MiB for k, p in enumerate(POOLS[:4])},
                    'host': {p: (i + 1) * 9 * MiB for p in POOLS[:4]}}
            for side in meas.values():
                side['total'] = sum(side.values())
            row.update(measured=meas, tokens_per_s=1000.0 * (i + 1), loss=4.5 - i * 0.1, step_s=0.5 / (i + 1))
        else:
            row.update(measured=None, tokens_per_s=None, loss=None, step_s=None)
        compare['rows'].append(row)
    with open(os.path.join(cmp_dir, 'compare.json'), 'w') as f:
        json.dump(compare, f)
    return run_a, run_b, cmp_dir, recs, compare


class Page(html.parser.HTMLParser):
    """The page's SVG elements (attributes, paths, texts), tables (rows of cell texts) and data block."""

    def __init__(self):
        super().__init__()
        self.svgs, self.tables, self.data = {}, {}, None
        self.svg = self.table = self.text_el = None
        self.cell = self.row = None
        self.in_data = False
        self.data_text = ''

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == 'svg':
            self.svg = {'attrs': a, 'paths': [], 'texts': [], 'rects': []}
            self.svgs[a['id']] = self.svg
        elif tag == 'path' and self.svg is not None:
            self.svg['paths'].append(a)
        elif tag == 'rect' and self.svg is not None:
            self.svg['rects'].append(a)
        elif tag == 'text' and self.svg is not None:
            self.text_el = [a.get('class'), '']
        elif tag == 'table':
            self.table = []
            self.tables.setdefault(a.get('class'), []).append(self.table)
        elif tag == 'tr' and self.table is not None:
            self.row = [a.get('class')]
            self.table.append(self.row)
        elif tag in ('td', 'th') and self.row is not None:
            self.cell = ''
        elif tag == 'script' and a.get('id') == 'zt-report-data':
            check(a.get('type') == 'application/json', 'the data block is a JSON script element, never run')
            self.in_data = True

    def handle_endtag(self, tag):
        if tag == 'svg':
            self.svg = None
        elif tag == 'text' and self.text_el is not None:
            self.svg['texts'].append(tuple(self.text_el))
            self.text_el = None
        elif tag in ('td', 'th') and self.cell is not None:
            self.row.append(self.cell.strip())
            self.cell = None
        elif tag == 'table':
            self.table = None
        elif tag == 'script' and self.in_data:
            self.in_data = False
            self.data = json.loads(self.data_text)

    def handle_data(self, d):
        if self.text_el is not None:
            self.text_el[1] += d
        if self.cell is not None:
            self.cell += d
        if self.in_data:
            self.data_text += d


def parse_page(path):
    p = Page()
    p.feed(open(path, encoding='utf-8').read())
    return p


def path_points(d):
    """The (x, y) of an SVG path's M/L commands."""
    pts = []
    for tok in d.replace('M', ' M').replace('L', ' L').split(' M'):
        for seg in tok.split(' L'):
            seg = seg.strip().lstrip('M').strip()
            if seg:
                x, y = seg.split()
                pts.append((float(x), float(y)))
    return pts


def to_pixels(svg, x, y):
    a = svg['attrs']
    left, right, top, bottom = (float(a[k]) for k in ('data-left', 'data-right', 'data-top', 'data-bottom'))
    x_lo, x_hi, y_lo, y_hi = (float(a[k]) for k in ('data-x-lo', 'data-x-hi', 'data-y-lo', 'data-y-hi'))
    return (left + (x - x_lo) / (x_hi - x_lo) * (right - left), bottom - (y - y_lo) / (y_hi - y_lo) * (bottom - top))


def series_of(data, chart_id):
    for c in data['charts']:
        if c['id'] == chart_id:
            return c
    return None


def close(a, b, rel=1e-12):
    return a is not None and b is not None and abs(a - b) <= rel * max(1.0, abs(a), abs(b))


def check_series(page, chart_id, name, xs, ys, rel=1e-12):
    chart = series_of(page.data, chart_id)
    check(chart is not None, f'chart {chart_id} in the data block')
    if chart is None:
        return
    found = [s for s in chart['series'] if s['name'] == name]
    check(len(found) == 1, f'{chart_id}: one series named {name!r} (have {[s["name"] for s in chart["series"]]})')
    if not found:
        return
    s = found[0]
    check(s['x'] == xs, f'{chart_id}/{name}: x = {xs} (got {s["x"]})')
    check(len(s['y']) == len(ys) and all(close(a, b, rel) for a, b in zip(s['y'], ys)),
          f'{chart_id}/{name}: y = {ys} (got {s["y"]})')
    # The SVG path plots the same points where the axes say they are.
    svg = page.svgs.get('chart-' + chart_id)
    paths = [p for p in svg['paths'] if p.get('data-series') == name]
    check(len(paths) == 1, f'{chart_id}: one SVG path for {name!r}')
    if paths:
        pts = path_points(paths[0]['d'])
        want = [to_pixels(svg, x, y) for x, y in zip(xs, ys)]
        check(len(pts) == len(want) and all(abs(p[0] - w[0]) < 0.01 and abs(p[1] - w[1]) < 0.01
                                            for p, w in zip(pts, want)),
              f'{chart_id}/{name}: the SVG path is at the values\' pixels')
        # ... and the PNG has the series' colour there (within the 2-pixel pen).
        colour = tuple(int(paths[0]['stroke'][i:i + 2], 16) for i in (1, 3, 5))
        w, h, rows = PNGS[chart_id]
        check((w, h) == (int(svg['attrs']['width']), int(svg['attrs']['height'])),
              f'{chart_id}.png is as large as its SVG')
        missing = []
        for px, py in want:
            near = [rows[y][x] for y in range(int(py) - 2, int(py) + 3) for x in range(int(px) - 2, int(px) + 3)
                    if 0 <= y < h and 0 <= x < w]
            if colour not in near:
                missing.append((px, py))
        check(not missing, f'{chart_id}.png: {name!r} drawn in {colour} at every point (missing at {missing[:3]})')


PNGS = {}


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    return p.returncode, p.stdout, p.stderr


def main():
    zt_report, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    run_a, run_b, cmp_dir, recs_a, compare = make_runs(work)
    out = os.path.join(work, 'out', 'report.html')
    os.makedirs(os.path.dirname(out))
    rc, so, se = run([zt_report, run_a, run_b + '/', cmp_dir, '-o', out])
    print(se, end='')
    check(rc == 0, f'zt-report exits 0 (got {rc})')
    if rc != 0:
        return
    check(f'{run_b}/metrics.jsonl:11: a torn last line' in se, 'the torn last line of runB is named on stderr')
    page = parse_page(out)
    check(page.data is not None, 'the page has its JSON data block')
    if page.data is None:
        return
    files = os.path.join(work, 'out', 'report_files')
    for c in page.data['charts']:
        path = os.path.join(work, 'out', c['png'])
        check(os.path.dirname(path) == files, f'{c["id"]}: its PNG is in report_files/')
        try:
            PNGS[c['id']] = pngread.read(path)
        except Exception as e:  # noqa: BLE001 - any failure to decode is the finding
            check(False, f'{path} decodes: {e}')
            PNGS[c['id']] = (0, 0, [])
        svg = page.svgs.get('chart-' + c['id'])
        check(svg is not None, f'chart {c["id"]} is an inline SVG')
        titles = [t for k, t in svg['texts'] if k == 'title'] if svg else []
        check(titles == [c['title']], f'{c["id"]}: the SVG shows the title {c["title"]!r}')

    train_a = [r for r in recs_a if r['type'] == 'train']
    steps = [float(r['step']) for r in train_a]
    A, B = run_a, run_b
    check_series(page, 'loss', f'{A} train', steps, [r['loss'] for r in train_a])
    evals = [r for r in recs_a if r['type'] == 'eval']
    check_series(page, 'loss', f'{A} eval', [float(r['step']) for r in evals], [r['eval_loss'] for r in evals])
    check_series(page, 'loss', f'{B} train', [float(s) for s in range(1, 11)],
                 [train_record(s, 20)['loss'] for s in range(1, 11)])
    check_series(page, 'lr', A, steps, [r['lr'] for r in train_a])
    check_series(page, 'grad_norm', A, steps, [r['grad_norm'] for r in train_a])
    check_series(page, 'loss_scale', A, steps, [r['loss_scale'] for r in train_a])
    check(all(s['name'] != B for s in series_of(page.data, 'loss_scale')['series']),
          'loss_scale: no series for runB, which has no loss scale')
    check_series(page, 'tokens_per_s', A, steps, [r['tokens_per_s'] for r in train_a])
    # memory by pool per rank, in the unit the y label names
    for chart_id, key in (('mem_device', 'mem_device'), ('mem_host', 'mem_host')):
        unit = series_of(page.data, chart_id)['ylabel']
        scale = {'B': 1, 'KiB': 1024.0, 'MiB': MiB, 'GiB': MiB * 1024}[unit]
        for rank in (0, 1):
            for pool in POOLS:
                name = f'{A} rank {rank} {pool}'
                if pool == 'kv_cache':
                    check(all(s['name'] != name for s in series_of(page.data, chart_id)['series']),
                          f'{chart_id}: no series for the unused pool {pool}')
                    continue
                ys = [train_record(s, 12, rank, True, True, True)[key][pool]['peak'] / scale for s in range(1, 13)]
                check_series(page, chart_id, name, steps, ys)
    check(all(not s['name'].startswith(B) for s in series_of(page.data, 'mem_device')['series']),
          'mem_device: runB (no GPU) has no series')
    for rank in (0, 1):
        check_series(page, 'comm', f'{A} rank {rank}', steps,
                     [train_record(s, 12, rank, True, True, True)['comm']['time_s'] for s in range(1, 13)])
    check_comm_tables(page, out, {A: [[r for r in read_jsonl(os.path.join(run_a, f)) if r['type'] == 'train']
                                      for f in ('metrics.jsonl', 'metrics.rank1.jsonl')]}, [B, cmp_dir])
    legend = [t for k, t in page.svgs['chart-loss']['texts'] if k == 'legend']
    check(legend == [f'{A} train', f'{A} eval', f'{B} train'], f'loss legend names each run by its dir: {legend}')
    axis = [(k, t) for k, t in page.svgs['chart-loss']['texts'] if k in ('xlabel', 'ylabel')]
    check(axis == [('xlabel', 'step'), ('ylabel', 'loss')], f'loss axis labels: {axis}')

    # summary table
    summary = page.tables.get('summary', [[]])[0]
    rows = {r[1]: r for r in summary[1:]}
    ra = rows.get(A)
    check(ra is not None, f'the summary has a row for {A}')
    if ra:
        check(ra[2] == '2' and ra[3] == '12 / 12', f'runA: 2 ranks, 12 / 12 steps: {ra}')
        check(ra[4] == f'{train_a[-1]["loss"]:.4f}' and ra[5] == f'{evals[-1]["eval_loss"]:.4f}',
              f'runA: final loss and eval loss: {ra}')
    rb = rows.get(B)
    check(rb is not None and rb[3] == '10 / 20' and rb[6] == '-', f'runB: 10 / 20 steps, no device memory: {rb}')
    runs = {r['name']: r for r in page.data['runs']}
    tps = sum(r['tokens'] for r in train_a[1:]) / sum(r['step_s'] for r in train_a[1:])
    check(close(runs[A]['tokens_per_s'], tps, 1e-9), f'runA tokens/s over steps 2.. = {tps}: {runs[A]}')
    peak_dev = max(train_record(s, 12, k, True, True, True)['mem_device']['total']['peak']
                   for s in range(1, 13) for k in (0, 1))
    check(runs[A]['peak_device'] == peak_dev, f'runA peak device memory = {peak_dev}: {runs[A]}')

    # config table: the keys set on the command line, with where they came from
    cfg = page.tables.get('config', [[]])[0]
    cfg_rows = {r[1]: r for r in cfg[1:]}
    check(cfg_rows.get('zero_optimization.stage', [None, None, ''])[2] == '2 (--set)',
          f'config: zero_optimization.stage is 2 from --set: {cfg_rows.get("zero_optimization.stage")}')
    check('seed' not in cfg_rows, 'config: a default key is only in the "every key" table')
    check('_plugins' not in str(cfg), 'config: zt\'s metadata keys are not config keys')

    # the comparison: one row per combination, the one that does not fit says so
    ctab = page.tables.get('compare', [[]])[0]
    body = ctab[1:]
    check(len(body) == 3, f'comparison: 3 rows (got {len(body)})')
    if len(body) == 3:
        check(body[0][0] == 'fits' and body[0][2:4] == ['1', 'none'], f'comparison row 1: {body[0]}')
        check(body[1][5] == f'{(2 * 90 * 4 + 6) / (1 * 90 * 4 + 6):.2f}x',
              f'comparison row 2: device total relative to row 1: {body[1]}')
        check(body[2][0] == 'nofit' and body[2][4] == 'does not fit: device: the optimizer state needs 12 GiB more',
              f'comparison row 3 does not fit, saying which pool: {body[2]}')
    bars = series_of(page.data, 'compare_mem_device')
    check(bars is not None and bars['kind'] == 'bars' and bars['stacks'] == POOLS[:4],
          f'compare_mem_device: stacked bars by pool: {bars and bars["stacks"]}')
    if bars:
        scale = {'MiB': MiB, 'GiB': MiB * 1024}[bars['xlabel']]
        for i, row in enumerate(compare['rows']):
            got = bars['rows'][i]
            if row['fits']:
                want = [row['measured']['device'][p] / scale for p in POOLS[:4]]
                check(all(close(a, b) for a, b in zip(got['values'], want)) and got['note'] is None,
                      f'compare_mem_device row {i + 1}: {got["values"]} = {want}')
            else:
                check(got['note'] == 'does not fit: ' + row['overflow'] and all(v is None for v in got['values']),
                      f'compare_mem_device row {i + 1}: no bar, a note: {got}')
        notes = [t for k, t in page.svgs['chart-compare_mem_device']['texts'] if k == 'bar-note']
        check(notes == ['does not fit: ' + compare['rows'][2]['overflow']], f'the SVG shows the note: {notes}')
    tok = series_of(page.data, 'compare_tokens')
    check(tok and [r['values'][0] for r in tok['rows']] == [1000.0, 2000.0, None],
          f'compare_tokens: tokens/s per row: {tok and tok["rows"]}')
    # bars in the PNG: the first stack's colour where row 2's first segment is
    svg = page.svgs['chart-compare_tokens']
    bar_rects = [r for r in svg['rects'] if r.get('class') == 'bar']
    check(len(bar_rects) == 2, f'compare_tokens: two bars (got {len(bar_rects)})')
    if bar_rects:
        w, h, px = PNGS['compare_tokens']
        r = bar_rects[1]
        cx, cy = float(r['x']) + float(r['width']) / 2, float(r['y']) + float(r['height']) / 2
        colour = tuple(int(r['fill'][i:i + 2], 16) for i in (1, 3, 5))
        check(px[int(cy)][int(cx)] == colour, f'compare_tokens.png: the bar colour {colour} at its middle')

    # non-background pixels: the PNG is not blank, and not all ink
    w, h, px = PNGS['loss']
    ink = sum(1 for row in px for p in row if p != (255, 255, 255))
    check(0.01 * w * h < ink < 0.5 * w * h, f'loss.png: {ink} of {w * h} pixels drawn')
    title_ink = sum(1 for row in px[10:28] for p in row[10:200] if p == (0x22, 0x22, 0x22))
    check(title_ink > 100, f'loss.png: the title is drawn ({title_ink} text pixels)')

    # a run without communication data says so
    out2 = os.path.join(work, 'out2', 'b.html')
    run_c = os.path.join(work, 'runC')  # one rank: an all_reduce on 1 rank moves nothing over a link
    os.makedirs(run_c)
    recs_c = []
    for s in range(1, 5):
        r = train_record(s, 4)
        ops = comm_ops(s, 0, 1)
        r['comm'] = {'time_s': sum(o['time_s'] for o in ops), 'share': 0.1, 'ops': ops}
        recs_c.append(r)
    write_lines(os.path.join(run_c, 'metrics.jsonl'), recs_c)
    out3 = os.path.join(work, 'out3', 'c.html')
    rc, so, se = run([zt_report, run_b, run_c, '-o', out3])
    check(rc == 0, f'runB and runC: exit 0 ({se})')
    p3 = parse_page(out3)
    check_comm_tables(p3, out3, {run_c: [recs_c]}, [run_b])
    check(all(r[9] == '0.000' for r in p3.tables.get('comm_ops', [[]])[0][1:] if r[2] == 'all_reduce'),
          'runC: an all_reduce on 1 rank has busbw 0')
    rc, so, se = run([zt_report, run_b, '-o', out2])
    check(rc == 0, f'runB alone: exit 0 ({se})')
    p2 = parse_page(out2)
    notes = [t for k, t in p2.svgs['chart-comm']['texts'] if k == 'empty-note']
    check(notes and notes[0].startswith('no communication data'), f'runB: the comm chart says so: {notes}')
    check(os.path.exists(os.path.join(work, 'out2', 'b_files', 'comm.png')), 'runB: comm.png is written too')

    check_errors(zt_report, work, run_a, out)
    check_self_contained(out)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith('\n')]


def expected_comm_rows(ranks_records):
    """The table zt-report should show, computed here from the records written: per rank (in file
    order), the "comm"."ops" summed by (op, group, ranks) in order of first use; algbw = bytes / time,
    busbw = algbw x nccl-tests' factor (docs/distributed.md)."""
    rows = []
    for rank, records in enumerate(ranks_records):
        sums = {}
        for r in records:
            for o in r.get('comm', {}).get('ops', []):
                key = (o['op'], o['group'], o['ranks'])
                acc = sums.setdefault(key, [0.0, 0.0, 0.0])
                acc[0] += o['count']
                acc[1] += o['bytes']
                acc[2] += o['time_s']
        for (op, group, n), (count, nbytes, t) in sums.items():
            factor = {'all_reduce': 2 * (n - 1) / n, 'reduce_scatter': (n - 1) / n,
                      'all_gather': (n - 1) / n}.get(op, 1.0)
            algbw = nbytes / t / 1e9
            rows.append({'rank': rank, 'op': op, 'group': group, 'ranks': n, 'count': count, 'bytes': nbytes,
                         'time_s': t, 'algbw_gbps': algbw, 'busbw_gbps': algbw * factor})
    return rows


def check_comm_tables(page, out, with_ops, without):
    """with_ops: run name -> the train records of each rank; without: runs whose page says there is no
    communication data. The tables (class comm_ops) are in the order of the runs that have one."""
    tables = page.tables.get('comm_ops', [])
    check(len(tables) == len(with_ops), f'one communication table per run with ops: {len(tables)}')
    text = open(out, encoding='utf-8').read()
    runs = {r['name']: r for r in page.data['runs']}
    for (name, ranks_records), table in zip(with_ops.items(), tables):
        want = expected_comm_rows(ranks_records)
        check(len({r['rank'] for r in want}) == len(ranks_records), f'{name}: every rank has ops to sum')
        header = table[0][1:]
        check(header == ['rank', 'op', 'group', 'ranks', 'calls', 'bytes', 'time s', 'algbw GB/s', 'busbw GB/s'],
              f'{name}: the communication table\'s columns: {header}')
        cells = [r[1:] for r in table[1:]]
        want_cells = [[str(w['rank']), w['op'], w['group'], str(w['ranks']), f'{w["count"]:.0f}',
                       f'{w["bytes"]:.0f}', f'{w["time_s"]:.6f}', f'{w["algbw_gbps"]:.3f}',
                       f'{w["busbw_gbps"]:.3f}'] for w in want]
        check(cells == want_cells, f'{name}: the communication table is the records\' sums:\n  got  {cells}\n'
                                   f'  want {want_cells}')
        got = runs[name]['comm_ops']
        check(len(got) == len(want) and all(
            g['rank'] == w['rank'] and g['op'] == w['op'] and g['group'] == w['group'] and g['ranks'] == w['ranks']
            and all(close(g[k], w[k]) for k in ('count', 'bytes', 'time_s', 'algbw_gbps', 'busbw_gbps'))
            for g, w in zip(got, want)), f'{name}: the data block\'s comm_ops are the exact sums: {got}')
    for name in without:
        check(f'<h3 class="comm">{name}</h3>\n<p class="note comm-none">no communication data' in text,
              f'{name}: the communication section says "no communication data"')
        check(runs[name]['comm_ops'] == [], f'{name}: no comm_ops in the data block')


def check_self_contained(out):
    text = open(out, encoding='utf-8').read()
    for bad in ('http://', 'https://', '<script src', '<link', '@import', 'url('):
        allowed = bad == 'http://' and text.count('http://') == text.count('http://www.w3.org/2000/svg')
        check(bad not in text or allowed, f'the page fetches nothing: it has {bad!r}')


def check_errors(zt_report, work, run_a, out):
    before = open(out, 'rb').read()

    def fails(args, rc_want, *words):
        rc, so, se = run([zt_report] + args)
        check(rc == rc_want and all(w in se for w in words),
              f'zt-report {" ".join(args)}: exit {rc_want} saying {words} (got {rc}: {se.strip()})')

    fails([os.path.join(work, 'nope'), '-o', out], 1, 'nope', 'No such file or directory')
    empty = os.path.join(work, 'empty')
    os.makedirs(empty)
    fails([empty, '-o', out], 1, 'holds no metrics.jsonl')
    bad = os.path.join(work, 'bad')
    os.makedirs(bad)
    lines = [json.dumps(train_record(s, 5)) for s in range(1, 6)]
    lines[2] = lines[2][:40] + 'garbage'
    open(os.path.join(bad, 'metrics.jsonl'), 'w').write('\n'.join(lines) + '\n')
    fails([run_a, bad, '-o', out], 1, f'{bad}/metrics.jsonl:3', 'only the last line')
    notdir = os.path.join(work, 'afile')
    open(notdir, 'w').write('x')
    fails([run_a, '-o', os.path.join(notdir, 'r.html')], 1, 'cannot write the report', 'afile')
    fails([], 2, 'give at least one RUN_DIR')
    fails(['--follow', run_a, bad], 2, 'one RUN_DIR')
    fails([run_a, '--bogus'], 2, '--bogus')
    check(open(out, 'rb').read() == before, 'failed runs leave the old page as it was')
    leftovers = [f for f in os.listdir(os.path.dirname(out)) if f not in ('report.html', 'report_files')]
    check(not leftovers, f'no temporary files are left beside the page: {leftovers}')


if __name__ == '__main__':
    main()
    if failures:
        print(f'{len(failures)} check(s) failed')
        sys.exit(1)
    print('ok')
