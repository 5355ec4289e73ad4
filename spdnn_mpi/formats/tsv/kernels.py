"""Numba kernels behind ``spdnn_mpi.formats.tsv.read``: parse and format blocks of TSV bytes.

Kept apart from the file handling so each module holds one idea: these
functions see only byte buffers and arrays, validate every field as they go
and report the first bad line through an error array; ``tsv`` turns that into
an InputFormatError naming the file and line. Compiled once, cached on disk.
"""

from __future__ import annotations

import numpy as np

from spdnn_mpi.util import jitcache

numba = jitcache.load_numba(__file__)  # before the @njit(cache=True) below
njit = numba.njit

# Error codes the kernel reports in err[0].
E_COLUMNS, E_NOT_INT, E_NOT_NUM, E_ID_LOW, E_ID_HIGH, E_BLANK, E_RANGE = range(1, 8)
_POW10 = np.array([10.0**k for k in range(23)])
_F32_MAX = float(np.finfo(np.float32).max)


# ---------------------------------------------------------------------------
# numba kernels
# ---------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _token(buf, p, stop):
    """(start, end) of the next whitespace-delimited token at or after ``p``."""
    while p < stop and (buf[p] == 9 or buf[p] == 32):
        p += 1
    s = p
    while p < stop and buf[p] != 9 and buf[p] != 32:
        p += 1
    return s, p


@njit(cache=True, nogil=True)
def _sign(buf, s):
    """(negative, position after an optional leading '-' or '+')."""
    if buf[s] == 45:
        return True, s + 1
    if buf[s] == 43:
        return False, s + 1
    return False, s


@njit(cache=True, nogil=True)
def _parse_int(buf, s, e):
    """(ok, value) of an optionally signed decimal integer; saturates, never overflows."""
    neg, s = _sign(buf, s)
    if s == e:
        return False, 0
    v = 0
    for k in range(s, e):
        d = np.int64(buf[k]) - 48
        if d < 0 or d > 9:
            return False, 0
        if v < 100000000000000000:
            v = v * 10 + d
    return True, -v if neg else v


@njit(cache=True, nogil=True)
def _parse_float(buf, s, e):
    """(ok, value) of a decimal number such as ``6.250000e-02``, ``1``, ``-.5E+3``."""
    neg, s = _sign(buf, s)
    mant = 0
    ndig = 0
    exp10 = 0
    seen = False
    p = s
    while p < e:
        d = np.int64(buf[p]) - 48
        if d < 0 or d > 9:
            break
        seen = True
        if mant == 0 and d == 0:
            pass
        elif ndig < 18:
            mant = mant * 10 + d
            ndig += 1
        else:
            exp10 += 1
        p += 1
    if p < e and buf[p] == 46:
        p += 1
        while p < e:
            d = np.int64(buf[p]) - 48
            if d < 0 or d > 9:
                break
            seen = True
            if mant == 0 and d == 0:
                exp10 -= 1
            elif ndig < 18:
                mant = mant * 10 + d
                ndig += 1
                exp10 -= 1
            p += 1
    if not seen:
        return False, 0.0
    if p < e and (buf[p] == 101 or buf[p] == 69):
        p += 1
        eneg = False
        if p < e and (buf[p] == 45 or buf[p] == 43):
            eneg = buf[p] == 45
            p += 1
        if p == e:
            return False, 0.0
        ev = 0
        while p < e:
            d = np.int64(buf[p]) - 48
            if d < 0 or d > 9:
                return False, 0.0
            if ev < 100000:
                ev = ev * 10 + d
            p += 1
        exp10 += -ev if eneg else ev
    if p != e:
        return False, 0.0
    if mant == 0:
        v = 0.0
    elif 0 <= exp10 <= 22:
        v = mant * _POW10[exp10]
    elif -22 <= exp10 < 0:
        v = mant / _POW10[-exp10]
    elif exp10 > 400:
        v = np.inf
    elif exp10 < -400:
        v = 0.0
    else:
        v = mant * 10.0**exp10
    return True, -v if neg else v


@njit(cache=True, nogil=True)
def parse_block(buf, ncols, max_a, max_b, out_a, out_b, out_v, line0, blank0, err):
    """Parse lines of ``ncols`` (1 or 3) fields: ids ``a`` [``b`` ``value``].

    Ids are checked against 1..max_a / 1..max_b and stored 0-based. Returns
    (entries parsed, last line number, line of a pending blank line or 0).
    On the first bad line ``err`` is filled (code, line, field, value, start,
    end of the line in ``buf``) and parsing stops. A blank line is an error
    only once a data line follows it, so trailing blank lines are accepted.
    """
    n = buf.shape[0]
    pos = 0
    count = 0
    line = line0
    blank = blank0
    # error state, kept in plain int64 locals so the kernel compiles once
    code = 0
    fld = 0
    value = 0
    start = 0
    stop = 0
    while pos < n:
        line += 1
        end = pos
        while end < n and buf[end] != 10:
            end += 1
        stop = end
        if stop > pos and buf[stop - 1] == 13:
            stop -= 1
        start = pos
        pos = end + 1
        s1, e1 = _token(buf, start, stop)
        if s1 == e1:
            if blank == 0:
                blank = line
            continue
        if blank != 0:
            code = E_BLANK
            line = blank
            stop = start
            break
        s2, e2 = _token(buf, e1, stop)
        if ncols == 3:
            s3, e3 = _token(buf, e2, stop)
            s4, e4 = _token(buf, e3, stop)
            bad = s3 == e3 or s4 != e4
        else:
            s3, e3 = s2, e2
            bad = s2 != e2
        if bad:
            p = start
            while True:
                ts, te = _token(buf, p, stop)
                if ts == te:
                    break
                value += 1
                p = te
            code = E_COLUMNS
            break
        # the two id checks stay written out: an inlined helper returning (code, id)
        # made the parse 13 % slower (prepare of 1920 real layers, 2026-12-05)
        ok, a = _parse_int(buf, s1, e1)
        fld = 1
        if not ok:
            code = E_NOT_INT
            break
        if a < 1 or a > max_a:
            code = E_ID_LOW if a < 1 else E_ID_HIGH
            value = a
            break
        if ncols == 3:
            ok, b = _parse_int(buf, s2, e2)
            fld = 2
            if not ok:
                code = E_NOT_INT
                break
            if b < 1 or b > max_b:
                code = E_ID_LOW if b < 1 else E_ID_HIGH
                value = b
                break
            ok, v = _parse_float(buf, s3, e3)
            fld = 3
            if not ok:
                code = E_NOT_NUM
                break
            if not abs(v) <= _F32_MAX:
                code = E_RANGE
                break
            out_b[count] = b - 1
            out_v[count] = v
        out_a[count] = a - 1
        fld = 0
        count += 1
    if code != 0:
        err[0] = code
        err[1] = line
        err[2] = fld
        err[3] = value
        err[4] = start
        err[5] = stop
    return count, line, blank


@njit(cache=True, nogil=True)
def scatter(rows, cols, vals, fill, out_c, out_v):
    """Stable counting-sort step: entry k goes to ``fill[rows[k]]++``.

    ``vals``/``out_v`` may be empty (binary inputs carry no values).
    """
    with_vals = out_v.shape[0] > 0
    for k in range(rows.shape[0]):
        r = rows[k]
        d = fill[r]
        fill[r] = d + 1
        out_c[d] = cols[k]
        if with_vals:
            out_v[d] = vals[k]


@njit(cache=True, nogil=True)
def sort_rows(indptr, cols, vals):
    """Sort each CSR row by column in place; True if some row repeats a column.

    Rows already in increasing order (the official layouts) cost one check.
    """
    with_vals = vals.shape[0] > 0
    dup = False
    for r in range(indptr.shape[0] - 1):
        lo = indptr[r]
        hi = indptr[r + 1]
        ordered = True
        for k in range(lo + 1, hi):
            if cols[k] <= cols[k - 1]:
                ordered = False
                break
        if not ordered:
            order = np.argsort(cols[lo:hi], kind="mergesort")
            cols[lo:hi] = cols[lo:hi][order]
            if with_vals:
                vals[lo:hi] = vals[lo:hi][order]
            for k in range(lo + 1, hi):
                if cols[k] == cols[k - 1]:
                    dup = True
    return dup


def coo_to_csr(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, n_rows: int):
    """(indptr, indices, values, has_duplicates): CSR with columns sorted per row."""
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n_rows), out=indptr[1:])
    out_c = np.empty(len(cols), dtype=cols.dtype)
    out_v = np.empty(len(vals), dtype=vals.dtype)
    scatter(rows, cols, vals, indptr[:-1].copy(), out_c, out_v)
    dup = sort_rows(indptr, out_c, out_v)
    return indptr, out_c, out_v, dup


@njit(cache=True, nogil=True)
def duplicate_keys(indptr, sorted_cols, n_cols):
    """Sorted distinct keys ``row * n_cols + col`` of the pairs a sorted CSR repeats."""
    nkeys = 0
    keys = np.empty(16, dtype=np.int64)
    for r in range(indptr.shape[0] - 1):
        for k in range(indptr[r] + 1, indptr[r + 1]):
            if sorted_cols[k] == sorted_cols[k - 1]:
                key = np.int64(r) * n_cols + np.int64(sorted_cols[k])
                if nkeys == 0 or keys[nkeys - 1] != key:
                    if nkeys == keys.shape[0]:
                        grown = np.empty(2 * nkeys, dtype=np.int64)
                        grown[:nkeys] = keys
                        keys = grown
                    keys[nkeys] = key
                    nkeys += 1
    return keys[:nkeys]


@njit(cache=True, nogil=True)
def scan_duplicates(rows, cols, n_cols, keys, first, offset):
    """Find, in file order, the first entry whose key was already seen.

    ``first[i]`` holds the position where key ``i`` was first seen (-1: not
    yet); entry k of this block is at position ``offset + k``. Returns
    (position, first position) or (-1, -1) to continue with the next block.
    """
    nkeys = keys.shape[0]
    for k in range(rows.shape[0]):
        key = np.int64(rows[k]) * n_cols + np.int64(cols[k])
        i = np.searchsorted(keys, key)
        if i < nkeys and keys[i] == key:
            if first[i] >= 0:
                return offset + k, first[i]
            first[i] = offset + k
    return -1, -1


@njit(cache=True, nogil=True)
def row_runs(rows, cols, prev_row, prev_col):
    """Run-length encode sorted rows; stops at the first out-of-order entry.

    Returns (run rows, run lengths, position of the first entry that breaks
    row-major order with strictly increasing columns or -1, and whether that
    entry repeats its predecessor exactly).
    """
    n = rows.shape[0]
    run_rows = np.empty(n, dtype=np.int64)
    run_len = np.empty(n, dtype=np.int64)
    nrun = 0
    pr = prev_row
    pc = prev_col
    for k in range(n):
        r = np.int64(rows[k])
        c = np.int64(cols[k])
        if r < pr or (r == pr and c <= pc):
            return run_rows[:nrun], run_len[:nrun], k, r == pr and c == pc
        if nrun > 0 and run_rows[nrun - 1] == r:
            run_len[nrun - 1] += 1
        else:
            run_rows[nrun] = r
            run_len[nrun] = 1
            nrun += 1
        pr = r
        pc = c
    return run_rows[:nrun], run_len[:nrun], -1, False


@njit(cache=True, nogil=True)
def format_block(indptr, indices, row_lo, row_hi, row_base, swap, val_idx, table, offsets, out):
    """Write ``a<TAB>b<TAB>value`` lines of CSR rows [row_lo, row_hi) into ``out``.

    The row id is ``row_base + r + 1`` and the column id ``indices[k] + 1``;
    ``swap`` writes the column first (layers: the CSR row is the output j).
    The value and its line break are ``table[offsets[t]:offsets[t + 1]]``
    with ``t = val_idx[k]`` (or 0 when ``val_idx`` is empty). Returns the
    number of bytes written.
    """
    digits = np.empty(20, dtype=np.uint8)
    p = 0
    uniform = val_idx.shape[0] == 0
    for r in range(row_lo, row_hi):
        for k in range(indptr[r], indptr[r + 1]):
            for f in range(2):
                if (f == 0) != swap:
                    x = np.int64(row_base) + r + 1
                else:
                    x = np.int64(indices[k]) + 1
                nd = 0
                while True:
                    digits[nd] = 48 + x % 10
                    nd += 1
                    x //= 10
                    if x == 0:
                        break
                for q in range(nd - 1, -1, -1):
                    out[p] = digits[q]
                    p += 1
                out[p] = 9
                p += 1
            t = 0 if uniform else val_idx[k]
            for q in range(offsets[t], offsets[t + 1]):
                out[p] = table[q]
                p += 1
    return p
