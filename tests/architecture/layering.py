#!/usr/bin/env python3
"""The source tree keeps the shape docs/architecture.md draws.

1. framework/ is subsystem folders only, and each folder includes only from the folders its row of
   the table "The host's folders" in docs/architecture.md allows (its last column, "may include").
   A host header is included by its path from framework/ ("train/trainer.h"), so the include names
   the folder it reaches into; a bare "name.h" that is a host header is an error too.
2. The tools outside framework/, dataprep/ (zt-prep) and report/ (zt-report), include only the host
   folders their rows in that table allow.
3. Plugins and kernels include nothing of the host: only the SDK (include/zt), kernels/ and their
   own folder's headers (plugins link nothing from the host; docs/plugins.md).
4. No source file outside tests/ is longer than MAX_LINES lines (one person can hold it).

Usage: layering.py SOURCE_DIR
"""
import os
import re
import sys

MAX_LINES = 1200
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCE = re.compile(r'\.(c|h|cc|cu|cuh|cpp)$')
TOOLS = ('dataprep', 'report')  # top-level folders of programs built on the host's library


def read_table(doc):
    """{'base': set(), 'config': {'base'}, ...} from the rows '| `framework/X/` | ... | a, b |' (and the
    tools' rows, '| `dataprep/` | ...')."""
    allowed = {}
    tools = '|'.join(t + '/' for t in TOOLS)
    for line in open(doc, encoding='utf-8'):
        m = re.match(r'\|\s*`(framework/(\w+)/|' + tools + r')`\s*\|.*\|\s*([^|]*?)\s*\|\s*$', line)
        if not m:
            continue
        name = m.group(2) or m.group(1).rstrip('/')
        cell = m.group(3).replace('`', '')
        allowed[name] = set() if cell in ('', '-', '(none)', 'nothing') else {
            w.strip().rstrip('/') for w in cell.split(',') if w.strip()}
    return allowed


def main():
    root = sys.argv[1]
    doc = os.path.join(root, 'docs', 'architecture.md')
    allowed = read_table(doc)
    problems = []
    fw = os.path.join(root, 'framework')
    folders = sorted(d for d in os.listdir(fw) if os.path.isdir(os.path.join(fw, d)))
    if not allowed or not folders:
        print(f'FAIL: no folder table in {doc} or no folders in framework/')
        return 1
    for d in folders:
        if d not in allowed:
            problems.append(f'framework/{d}/ has no row in the folder table of docs/architecture.md')
    for d in allowed:
        if d not in TOOLS and d not in folders:
            problems.append(f'docs/architecture.md has a row for framework/{d}/, which does not exist')
        for other in allowed[d]:
            if other not in allowed or other in TOOLS:
                problems.append(f'docs/architecture.md: framework/{d}/ may include "{other}", which is no host folder')
    stray = [f for f in os.listdir(fw) if SOURCE.search(f)]
    for f in stray:
        problems.append(f'framework/{f}: a source file outside the subsystem folders; move it into one')
    host_headers = {}
    for d in folders:
        for f in os.listdir(os.path.join(fw, d)):
            if f.endswith('.h'):
                host_headers.setdefault(f, []).append(d)

    def check_file(path, owner, may):
        text = open(path, encoding='utf-8', errors='replace').read()
        here = os.path.dirname(path)
        for m in INCLUDE.finditer(text):
            inc = m.group(1)
            line = text.count('\n', 0, m.start()) + 1
            where = f'{os.path.relpath(path, root)}:{line}'
            top = inc.split('/')[0]
            if inc.startswith('zt/'):
                continue  # the SDK
            if '/' in inc and top in folders:
                if top != owner and top not in may:
                    problems.append(f'{where}: includes "{inc}", but {owner_name(owner)} may include only '
                                    f'{", ".join(sorted(may)) or "nothing of the host"} (docs/architecture.md)')
                continue
            if inc.startswith('../'):
                problems.append(f'{where}: includes "{inc}" by a relative path out of its folder')
                continue
            if '/' not in inc and inc in host_headers and not os.path.exists(os.path.join(here, inc)):
                problems.append(f'{where}: includes the host header "{inc}" by its bare name; write '
                                f'"{host_headers[inc][0]}/{inc}"')

    def owner_name(owner):
        return f'{owner}/' if owner in TOOLS else f'framework/{owner}/'

    for d in folders:
        for dirpath, _, files in os.walk(os.path.join(fw, d)):
            for f in files:
                if SOURCE.search(f):
                    check_file(os.path.join(dirpath, f), d, allowed.get(d, set()))
    for tool in TOOLS:
        if tool not in allowed:
            problems.append(f'{tool}/ has no row in the folder table of docs/architecture.md')
        for f in os.listdir(os.path.join(root, tool)):
            if SOURCE.search(f):
                check_file(os.path.join(root, tool, f), tool, allowed.get(tool, set()))

    # Plugins and kernels: nothing of the host.
    for top in ('plugins', 'kernels', 'examples'):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if not SOURCE.search(f):
                    continue
                path = os.path.join(dirpath, f)
                text = open(path, encoding='utf-8', errors='replace').read()
                for m in INCLUDE.finditer(text):
                    inc = m.group(1)
                    line = text.count('\n', 0, m.start()) + 1
                    if inc.split('/')[0] in folders or 'framework/' in inc or (
                            '/' not in inc and inc in host_headers and not os.path.exists(os.path.join(dirpath, inc))):
                        problems.append(f'{os.path.relpath(path, root)}:{line}: includes the host header "{inc}"; '
                                        'plugins and kernels see only the SDK (include/zt)')

    # File length.
    for top in ('framework', 'plugins', 'kernels', 'include', 'examples') + TOOLS:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if SOURCE.search(f):
                    path = os.path.join(dirpath, f)
                    n = sum(1 for _ in open(path, encoding='utf-8', errors='replace'))
                    if n > MAX_LINES:
                        problems.append(f'{os.path.relpath(path, root)}: {n} lines, over {MAX_LINES}; split it by concern')

    for p in problems:
        print('FAIL:', p)
    print(f'checked {len(folders)} host folders against docs/architecture.md: {len(problems)} problem(s)')
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main())
