/*
 * Compiled fast path of the log scanner (forensics.logs.scanner): batch lines and
 * uvicorn access lines of journalctl short-iso text and of plain sglang logs.
 *
 * The contract is narrow on purpose: a line is taken here only when it is in the exact
 * canonical form the Python regexes read; any other line holding the literal is
 * "declined" (its start offset is handed back) and the Python path reads it, so both
 * paths give the same rows. Every read is bounds-checked against the line's end.
 *
 *   batch_lines(data, fmt, layouts, origins) -> tuple of 11 bytes buffers + declined
 *   access_counts(data, counts) -> (counted, declined)
 *
 * fmt: 0 = plain (sglang prefix only), 1 = short-iso journal. See scanner.py for the
 * meaning of every returned buffer.
 */
#define _GNU_SOURCE  /* memmem */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define NAT INT64_MIN
#define FMT_PLAIN 0
#define FMT_ISO 1
#define MAX_FIELDS 64
#define LAYOUT_CACHE 32

/* ------------------------------------------------------------ growable buffers */
typedef struct {
    char *data;
    Py_ssize_t used;
    Py_ssize_t cap;
} Buf;

static int buf_reserve(Buf *b, Py_ssize_t more) {
    if (b->used + more <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < b->used + more) cap *= 2;
    char *grown = PyMem_Realloc(b->data, (size_t)cap);
    if (!grown) { PyErr_NoMemory(); return -1; }
    b->data = grown;
    b->cap = cap;
    return 0;
}

static int buf_put(Buf *b, const void *src, Py_ssize_t n) {
    if (buf_reserve(b, n) < 0) return -1;
    memcpy(b->data + b->used, src, (size_t)n);
    b->used += n;
    return 0;
}

static PyObject *buf_bytes(Buf *b) {
    return PyBytes_FromStringAndSize(b->data ? b->data : "", b->used);
}

static void buf_free(Buf *b) { PyMem_Free(b->data); b->data = NULL; b->used = b->cap = 0; }

/* ------------------------------------------------------------------ scanning */
static inline int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
/* Python's bytes-regex \s */
static inline int is_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* Read exactly n digits at *p (< end) into *out. */
static int digits_n(const unsigned char **p, const unsigned char *end, int n, int *out) {
    if (end - *p < n) return 0;
    int v = 0;
    for (int i = 0; i < n; i++) {
        unsigned char c = (*p)[i];
        if (!is_digit(c)) return 0;
        v = v * 10 + (c - '0');
    }
    *p += n;
    *out = v;
    return 1;
}

static inline int expect(const unsigned char **p, const unsigned char *end, unsigned char c) {
    if (*p < end && **p == c) { (*p)++; return 1; }
    return 0;
}

static int64_t days_from_civil(int64_t y, int m, int d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static int valid_date(int y, int m, int d) {
    static const int mdays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (y < 1700 || y > 2200 || m < 1 || m > 12 || d < 1) return 0;
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    int limit = mdays[m - 1] + (m == 2 && leap);
    return d <= limit;
}

/* "YYYY-MM-DD<sep>HH:MM:SS" with an optional fraction (1-9 digits, '.' or also ',' when
 * comma_ok) into naive epoch ns. Returns 0 when not canonical. */
static int parse_datetime(const unsigned char **p, const unsigned char *end, unsigned char sep,
                          int comma_ok, int64_t *ns) {
    int y, mo, d, h, mi, s;
    if (!digits_n(p, end, 4, &y) || !expect(p, end, '-') || !digits_n(p, end, 2, &mo) ||
        !expect(p, end, '-') || !digits_n(p, end, 2, &d) || !expect(p, end, sep) ||
        !digits_n(p, end, 2, &h) || !expect(p, end, ':') || !digits_n(p, end, 2, &mi) ||
        !expect(p, end, ':') || !digits_n(p, end, 2, &s))
        return 0;
    if (!valid_date(y, mo, d) || h > 23 || mi > 59 || s > 59) return 0;
    int64_t frac = 0;
    if (*p < end && (**p == '.' || (comma_ok && **p == ','))) {
        (*p)++;
        int n = 0;
        while (*p < end && is_digit(**p)) {
            if (n == 9) return 0;  /* finer than ns: leave it to the Python path */
            frac = frac * 10 + (**p - '0');
            (*p)++;
            n++;
        }
        if (n == 0) return 0;
        for (; n < 9; n++) frac *= 10;
    }
    *ns = ((days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + s) * 1000000000LL) + frac;
    return 1;
}

/* Optional zone "Z" / "+HH:MM" / "+HHMM" into minutes east of UTC. */
static int parse_zone(const unsigned char **p, const unsigned char *end, int *minutes, int *present) {
    *minutes = 0;
    *present = 0;
    if (*p >= end) return 1;
    if (**p == 'Z') { (*p)++; *present = 1; return 1; }
    if (**p != '+' && **p != '-') return 1;
    int sign = **p == '-' ? -1 : 1;
    (*p)++;
    int hh, mm;
    if (!digits_n(p, end, 2, &hh)) return 0;
    expect(p, end, ':');
    if (!digits_n(p, end, 2, &mm)) return 0;
    if (hh > 14 || mm > 59) return 0;
    *minutes = sign * (hh * 60 + mm);
    *present = 1;
    return 1;
}

typedef struct {
    const unsigned char *host, *unit;
    Py_ssize_t host_len, unit_len;
} Origin;

/* Journal short-iso prefix up to the message; ns is UTC. */
static int parse_journal_iso(const unsigned char **p, const unsigned char *end, int64_t *ns, Origin *o) {
    int64_t naive;
    int zone, present;
    if (!parse_datetime(p, end, 'T', 1, &naive) || !parse_zone(p, end, &zone, &present)) return 0;
    *ns = naive - (int64_t)zone * 60000000000LL;
    if (!expect(p, end, ' ')) return 0;
    /* NUL separates host and unit in the interned origin key: such lines go to Python */
    o->host = *p;
    while (*p < end && !is_space(**p) && **p != 0) (*p)++;
    o->host_len = *p - o->host;
    if (o->host_len == 0 || !expect(p, end, ' ')) return 0;
    o->unit = *p;
    while (*p < end && !is_space(**p) && **p != '[' && **p != ':' && **p != 0) (*p)++;
    o->unit_len = *p - o->unit;
    if (o->unit_len == 0) return 0;
    if (expect(p, end, '[')) {
        const unsigned char *digits = *p;
        while (*p < end && is_digit(**p)) (*p)++;
        if (*p == digits || !expect(p, end, ']')) return 0;
    }
    if (!expect(p, end, ':')) return 0;
    expect(p, end, ' ');
    return 1;
}

/* sglang prefix "[YYYY-MM-DD HH:MM:SS(.f) DP1 PP0 TP3] ". Ranks stay -1 when absent. */
static int parse_sglang_prefix(const unsigned char **p, const unsigned char *end, int64_t *ns,
                               int32_t ranks[3]) {
    if (!expect(p, end, '[')) return 0;
    if (!parse_datetime(p, end, ' ', 0, ns)) return 0;
    while (*p < end && **p == ' ') {
        (*p)++;
        const unsigned char *name = *p;
        while (*p < end && ((**p >= 'A' && **p <= 'Z') || **p == '_')) (*p)++;
        Py_ssize_t name_len = *p - name;
        const unsigned char *digits = *p;
        int64_t value = 0;
        while (*p < end && is_digit(**p)) {
            if (*p - digits >= 9) return 0;
            value = value * 10 + (**p - '0');
            (*p)++;
        }
        if (name_len == 0 || *p == digits) return 0;
        if (name_len == 2 && name[1] == 'P') {
            if (name[0] == 'D') ranks[0] = (int32_t)value;
            else if (name[0] == 'T') ranks[1] = (int32_t)value;
            else if (name[0] == 'P') ranks[2] = (int32_t)value;
        }
    }
    if (!expect(p, end, ']')) return 0;
    expect(p, end, ' ');
    return 1;
}

static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* A canonical value: "True"/"False" (kind 1) or a digit, digits, an optional fraction and an
 * optional trailing '%' (kind 0). Correctly rounded, like float(). */
static int parse_value(const unsigned char *s, const unsigned char *end, double *out, uint8_t *kind) {
    Py_ssize_t n = end - s;
    if (n == 4 && memcmp(s, "True", 4) == 0) { *out = 1.0; *kind = 1; return 1; }
    if (n == 5 && memcmp(s, "False", 5) == 0) { *out = 0.0; *kind = 1; return 1; }
    if (n > 0 && end[-1] == '%') { end--; n--; }
    if (n <= 0 || n > 64) return 0;
    /* sglang formats numbers with a digit at each end: ".12" and "1." are declined (the
     * Python path reads them exactly), not read as 0.12 and 1 */
    if (!is_digit(*s) || !is_digit(end[-1])) return 0;
    uint64_t mantissa = 0;
    int digits = 0, frac = 0, dot = 0;
    for (const unsigned char *q = s; q < end; q++) {
        if (is_digit(*q)) {
            if (digits < 19) mantissa = mantissa * 10 + (*q - '0');
            digits++;
            if (dot) frac++;
        } else if (*q == '.' && !dot) {
            dot = 1;
        } else {
            return 0;
        }
    }
    if (digits == 0) return 0;
    /* An integer a double cannot hold exactly (counters are exact Int64): decline the line,
     * the Python path reads it with int(). */
    if (!dot && (digits > 19 || mantissa > (1ULL << 53))) return 0;
    *kind = 0;
    if (digits <= 19 && mantissa <= (1ULL << 53) && frac <= 22) {
        /* both operands exact, so one IEEE division is correctly rounded */
        *out = (double)mantissa / POW10[frac];
        return 1;
    }
    char text[72];
    memcpy(text, s, (size_t)n);
    text[n] = 0;
    double v = PyOS_string_to_double(text, NULL, NULL);
    if (v == -1.0 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
    *out = v;
    return 1;
}

/* Small cache of recently seen keys (layouts, origins) in front of a Python dict. */
typedef struct {
    char *key[LAYOUT_CACHE];
    Py_ssize_t len[LAYOUT_CACHE];
    int32_t id[LAYOUT_CACHE];
    int used, next;
} KeyCache;

static void cache_free(KeyCache *c) {
    for (int i = 0; i < c->used; i++) PyMem_Free(c->key[i]);
    c->used = c->next = 0;
}

/* id of key in dict (added with id len(dict) when new); -1 with an exception on error. */
static int32_t intern_key(KeyCache *c, PyObject *dict, const char *key, Py_ssize_t len) {
    for (int i = 0; i < c->used; i++)
        if (c->len[i] == len && memcmp(c->key[i], key, (size_t)len) == 0) return c->id[i];
    PyObject *k = PyBytes_FromStringAndSize(key, len);
    if (!k) return -1;
    PyObject *found = PyDict_GetItemWithError(dict, k);
    long id;
    if (found) {
        id = PyLong_AsLong(found);
        if (id == -1 && PyErr_Occurred()) { Py_DECREF(k); return -1; }
    } else {
        if (PyErr_Occurred()) { Py_DECREF(k); return -1; }
        id = (long)PyDict_Size(dict);
        PyObject *v = PyLong_FromLong(id);
        if (!v || PyDict_SetItem(dict, k, v) < 0) { Py_XDECREF(v); Py_DECREF(k); return -1; }
        Py_DECREF(v);
    }
    Py_DECREF(k);
    int slot;
    if (c->used < LAYOUT_CACHE) {
        slot = c->used++;
    } else {
        slot = c->next++ % LAYOUT_CACHE;
        PyMem_Free(c->key[slot]);
        c->key[slot] = NULL;
        c->len[slot] = -1;
    }
    c->key[slot] = PyMem_Malloc((size_t)(len ? len : 1));
    if (!c->key[slot]) { PyErr_NoMemory(); return -1; }
    memcpy(c->key[slot], key, (size_t)len);
    c->len[slot] = len;
    c->id[slot] = (int32_t)id;
    return (int32_t)id;
}

enum { B_START, B_LAYOUT, B_TIME, B_DP, B_TP, B_PP, B_ITER, B_VSTART, B_VALUES, B_KINDS, B_ORIGIN,
       B_DECLINED, B_COUNT };

typedef struct {
    int32_t layout, origin, ranks[3];
    int64_t time, iter;
    int n_values;
    double values[MAX_FIELDS];
    uint8_t kinds[MAX_FIELDS];
} Row;

/* Parse one batch line [s, e) (no newline). 1 = parsed, 0 = declined, -1 = error. */
static int parse_batch_line(const unsigned char *s, const unsigned char *e, int fmt, Row *row,
                            Buf *scratch, KeyCache *layouts_cache, PyObject *layouts,
                            KeyCache *origins_cache, PyObject *origins) {
    while (e > s && e[-1] == '\r') e--;
    const unsigned char *p = s;
    Origin origin = {0};
    int64_t journal_ns = NAT, sglang_ns = NAT;
    row->ranks[0] = row->ranks[1] = row->ranks[2] = -1;
    row->iter = -1;
    if (fmt == FMT_ISO && !parse_journal_iso(&p, e, &journal_ns, &origin)) return 0;
    if (p < e && *p == '[' && !parse_sglang_prefix(&p, e, &sglang_ns, row->ranks)) return 0;
    char kind;
    if (e - p >= 13 && memcmp(p, "Prefill batch", 13) == 0) { kind = 'P'; p += 13; }
    else if (e - p >= 12 && memcmp(p, "Decode batch", 12) == 0) { kind = 'D'; p += 12; }
    else return 0;
    if (e - p >= 2 && p[0] == ' ' && p[1] == '[') {
        p += 2;
        const unsigned char *digits = p;
        int64_t iter = 0;
        while (p < e && is_digit(*p)) {
            if (p - digits >= 15) return 0;
            iter = iter * 10 + (*p - '0');
            p++;
        }
        if (p == digits || !expect(&p, e, ']')) return 0;
        row->iter = iter;
    }
    if (p >= e || (*p != '.' && *p != ',')) return 0;
    p++;
    if (!expect(&p, e, ' ')) return 0;
    /* fields: "label: value" joined by ", ". A canonical label holds no ':' or ',' and a
     * canonical value no ',' or ':', so the first ": " of a part is also its last (the
     * Python path splits at the last) and one forward pass reads the line. */
    scratch->used = 0;
    if (buf_put(scratch, &kind, 1) < 0) return -1;
    int n = 0;
    static const char nul = 0;
    while (1) {
        const unsigned char *label = p;
        while (p < e && *p != ':' && *p != ',' && *p != '\r' && *p != 0) p++;
        if (p == label || e - p < 2 || p[0] != ':' || p[1] != ' ' || n == MAX_FIELDS) return 0;
        const unsigned char *label_end = p;
        p += 2;
        const unsigned char *value = p;
        while (p < e && *p != ',' && *p != ':') p++;
        if (p < e && (*p == ':' || e - p < 2 || p[1] != ' ')) return 0;
        if (!parse_value(value, p, &row->values[n], &row->kinds[n])) return 0;
        n++;
        if (buf_put(scratch, label, label_end - label) < 0 || buf_put(scratch, &nul, 1) < 0) return -1;
        if (p == e) break;
        p += 2;
    }
    row->n_values = n;
    row->time = fmt == FMT_ISO ? journal_ns : sglang_ns;
    row->layout = intern_key(layouts_cache, layouts, scratch->data, scratch->used);
    if (row->layout < 0) return -1;
    row->origin = -1;
    if (fmt == FMT_ISO) {
        scratch->used = 0;
        if (buf_put(scratch, origin.host, origin.host_len) < 0 || buf_put(scratch, &nul, 1) < 0 ||
            buf_put(scratch, origin.unit, origin.unit_len) < 0)
            return -1;
        row->origin = intern_key(origins_cache, origins, scratch->data, scratch->used);
        if (row->origin < 0) return -1;
    }
    return 1;
}

static PyObject *batch_lines(PyObject *self, PyObject *args) {
    Py_buffer view;
    int fmt;
    PyObject *layouts, *origins;
    if (!PyArg_ParseTuple(args, "y*iO!O!", &view, &fmt, &PyDict_Type, &layouts, &PyDict_Type, &origins))
        return NULL;
    if (fmt != FMT_PLAIN && fmt != FMT_ISO) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "fmt must be 0 (plain) or 1 (short-iso)");
        return NULL;
    }
    const unsigned char *data = view.buf;
    const unsigned char *end = data + view.len;
    Buf out[B_COUNT];
    memset(out, 0, sizeof(out));
    Buf scratch = {0};
    KeyCache layouts_cache = {0}, origins_cache = {0};
    Row row;
    PyObject *result = NULL;
    int64_t value_index = 0;
    const unsigned char *pos = data;
    while (pos < end) {
        const unsigned char *hit = memmem(pos, (size_t)(end - pos), " batch", 6);
        if (!hit) break;
        const unsigned char *s = hit;
        while (s > data && s[-1] != '\n') s--;
        const unsigned char *e = memchr(hit, '\n', (size_t)(end - hit));
        if (!e) e = end;
        pos = e;  /* the next search starts at this line's newline, as the Python loop does */
        int64_t start = s - data;
        int parsed = parse_batch_line(s, e, fmt, &row, &scratch, &layouts_cache, layouts,
                                      &origins_cache, origins);
        if (parsed < 0) goto done;
        if (parsed == 0) {
            if (buf_put(&out[B_DECLINED], &start, 8) < 0) goto done;
            continue;
        }
        if (buf_put(&out[B_START], &start, 8) < 0 || buf_put(&out[B_LAYOUT], &row.layout, 4) < 0 ||
            buf_put(&out[B_TIME], &row.time, 8) < 0 || buf_put(&out[B_DP], &row.ranks[0], 4) < 0 ||
            buf_put(&out[B_TP], &row.ranks[1], 4) < 0 || buf_put(&out[B_PP], &row.ranks[2], 4) < 0 ||
            buf_put(&out[B_ITER], &row.iter, 8) < 0 || buf_put(&out[B_VSTART], &value_index, 8) < 0 ||
            buf_put(&out[B_VALUES], row.values, 8 * row.n_values) < 0 ||
            buf_put(&out[B_KINDS], row.kinds, row.n_values) < 0 ||
            buf_put(&out[B_ORIGIN], &row.origin, 4) < 0)
            goto done;
        value_index += row.n_values;
    }
    result = PyTuple_New(B_COUNT);
    if (!result) goto done;
    for (int i = 0; i < B_COUNT; i++) {
        PyObject *b = buf_bytes(&out[i]);
        if (!b) { Py_CLEAR(result); goto done; }
        PyTuple_SET_ITEM(result, i, b);
    }
done:
    for (int i = 0; i < B_COUNT; i++) buf_free(&out[i]);
    buf_free(&scratch);
    cache_free(&layouts_cache);
    cache_free(&origins_cache);
    PyBuffer_Release(&view);
    return result;
}

/* ------------------------------------------------------------- access lines */
/* Key parts: minute, zone, host, unit, method, path, status (as _ACCESS_KEY's groups). */
#define ACCESS_PARTS 7

typedef struct {
    uint64_t hash;
    char *key;  /* the parts, each as a 4-byte length then its bytes */
    Py_ssize_t key_len;
    Py_ssize_t count;
} AccessEntry;

/* Open addressing over slot -> entry index; entries stay in first-seen order, so the
 * counts dict receives new keys in the order the Python path would add them. */
typedef struct {
    Py_ssize_t *slots;  /* -1 = empty */
    Py_ssize_t cap;
    AccessEntry *entries;
    Py_ssize_t used, entries_cap;
} AccessTable;

static uint64_t fnv(const char *s, Py_ssize_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (Py_ssize_t i = 0; i < n; i++) { h ^= (unsigned char)s[i]; h *= 1099511628211ULL; }
    return h;
}

static int table_grow(AccessTable *t) {
    Py_ssize_t cap = t->cap ? t->cap * 2 : 256;
    Py_ssize_t *slots = PyMem_Malloc((size_t)cap * sizeof(Py_ssize_t));
    if (!slots) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < cap; i++) slots[i] = -1;
    for (Py_ssize_t e = 0; e < t->used; e++) {
        Py_ssize_t j = (Py_ssize_t)(t->entries[e].hash & (uint64_t)(cap - 1));
        while (slots[j] >= 0) j = (j + 1) & (cap - 1);
        slots[j] = e;
    }
    PyMem_Free(t->slots);
    t->slots = slots;
    t->cap = cap;
    return 0;
}

static int table_add(AccessTable *t, const char *key, Py_ssize_t len) {
    if (t->used * 2 >= t->cap && table_grow(t) < 0) return -1;
    uint64_t h = fnv(key, len);
    Py_ssize_t j = (Py_ssize_t)(h & (uint64_t)(t->cap - 1));
    while (t->slots[j] >= 0) {
        AccessEntry *entry = &t->entries[t->slots[j]];
        if (entry->hash == h && entry->key_len == len && memcmp(entry->key, key, (size_t)len) == 0) {
            entry->count++;
            return 0;
        }
        j = (j + 1) & (t->cap - 1);
    }
    if (t->used == t->entries_cap) {
        Py_ssize_t cap = t->entries_cap ? t->entries_cap * 2 : 128;
        AccessEntry *entries = PyMem_Realloc(t->entries, (size_t)cap * sizeof(AccessEntry));
        if (!entries) { PyErr_NoMemory(); return -1; }
        t->entries = entries;
        t->entries_cap = cap;
    }
    char *copy = PyMem_Malloc((size_t)(len ? len : 1));
    if (!copy) { PyErr_NoMemory(); return -1; }
    memcpy(copy, key, (size_t)len);
    AccessEntry *entry = &t->entries[t->used];
    entry->hash = h;
    entry->key = copy;
    entry->key_len = len;
    entry->count = 1;
    t->slots[j] = t->used++;
    return 0;
}

static void table_free(AccessTable *t) {
    for (Py_ssize_t i = 0; i < t->used; i++) PyMem_Free(t->entries[i].key);
    PyMem_Free(t->entries);
    PyMem_Free(t->slots);
    t->entries = NULL;
    t->slots = NULL;
    t->cap = t->used = t->entries_cap = 0;
}

static int put_part(Buf *key, const unsigned char *s, Py_ssize_t n) {
    uint32_t len = (uint32_t)n;
    if (buf_put(key, &len, 4) < 0) return -1;
    return buf_put(key, s, n);
}

/* The access key of line [s, e) into `key`. 1 = parsed, 0 = declined, -1 = error. */
static int parse_access_line(const unsigned char *s, const unsigned char *e, Buf *key) {
    const unsigned char *p = s;
    key->used = 0;
    /* minute "YYYY-MM-DDTHH:MM", then ":SS" and an optional fraction */
    const unsigned char *minute = p;
    int y, mo, d, h, mi, sec;
    if (!digits_n(&p, e, 4, &y) || !expect(&p, e, '-') || !digits_n(&p, e, 2, &mo) ||
        !expect(&p, e, '-') || !digits_n(&p, e, 2, &d) || !expect(&p, e, 'T') ||
        !digits_n(&p, e, 2, &h) || !expect(&p, e, ':') || !digits_n(&p, e, 2, &mi))
        return 0;
    const unsigned char *minute_end = p;
    if (!expect(&p, e, ':') || !digits_n(&p, e, 2, &sec)) return 0;
    if (p < e && (*p == '.' || *p == ',')) {
        p++;
        const unsigned char *digits = p;
        while (p < e && is_digit(*p)) p++;
        if (p == digits) return 0;
    }
    const unsigned char *zone = p;
    if (p < e && (*p == '+' || *p == '-')) {
        /* regex: [+-]\d\d:?\d\d, any digits */
        int hh, mm;
        p++;
        if (!digits_n(&p, e, 2, &hh)) return 0;
        expect(&p, e, ':');
        if (!digits_n(&p, e, 2, &mm)) return 0;
    } else if (p < e && *p == 'Z') {
        p++;
    }
    const unsigned char *zone_end = p;
    if (!expect(&p, e, ' ')) return 0;
    const unsigned char *host = p;
    while (p < e && !is_space(*p)) p++;
    const unsigned char *host_end = p;
    if (host_end == host || !expect(&p, e, ' ')) return 0;
    const unsigned char *unit = p;
    while (p < e && !is_space(*p) && *p != '[' && *p != ':') p++;
    const unsigned char *unit_end = p;
    if (unit_end == unit) return 0;
    if (expect(&p, e, '[')) {
        const unsigned char *digits = p;
        while (p < e && is_digit(*p)) p++;
        if (p == digits || !expect(&p, e, ']')) return 0;
    }
    if (!expect(&p, e, ':')) return 0;
    expect(&p, e, ' ');
    /* sglang's uvicorn config prefixes "[YYYY-MM-DD HH:MM:SS] "; the journal's time is used */
    if (p < e && *p == '[') {
        const unsigned char *close = memchr(p, ']', (size_t)(e - p));
        if (!close || close + 1 >= e || close[1] != ' ') return 0;
        p = close + 2;
    }
    static const char *levels[] = {"INFO", "WARNING", "ERROR", "DEBUG"};
    int level_ok = 0;
    for (int i = 0; i < 4 && !level_ok; i++) {
        size_t n = strlen(levels[i]);
        if ((size_t)(e - p) >= n && memcmp(p, levels[i], n) == 0) { p += n; level_ok = 1; }
    }
    if (!level_ok || !expect(&p, e, ':')) return 0;
    const unsigned char *ws = p;
    while (p < e && is_space(*p)) p++;
    if (p == ws) return 0;
    const unsigned char *client = p;
    while (p < e && !is_space(*p)) p++;
    if (p == client) return 0;
    if (e - p < 4 || memcmp(p, " - \"", 4) != 0) return 0;
    p += 4;
    const unsigned char *method = p;
    while (p < e && *p >= 'A' && *p <= 'Z') p++;
    const unsigned char *method_end = p;
    if (method_end == method || !expect(&p, e, ' ')) return 0;
    const unsigned char *path = p;
    while (p < e && !is_space(*p)) p++;
    const unsigned char *path_end = p;
    if (path_end == path || e - p < 6 || memcmp(p, " HTTP/", 6) != 0) return 0;
    p += 6;
    const unsigned char *version = p;
    while (p < e && (is_digit(*p) || *p == '.')) p++;
    if (p == version || !expect(&p, e, '"') || !expect(&p, e, ' ')) return 0;
    const unsigned char *status = p;
    int code;
    if (!digits_n(&p, e, 3, &code)) return 0;
    /* findall would look for a second match in the rest of the line: leave such lines to it */
    if (e - p >= 6 && memmem(p, (size_t)(e - p), " HTTP/", 6)) return 0;
    if (put_part(key, minute, minute_end - minute) < 0 || put_part(key, zone, zone_end - zone) < 0 ||
        put_part(key, host, host_end - host) < 0 || put_part(key, unit, unit_end - unit) < 0 ||
        put_part(key, method, method_end - method) < 0 || put_part(key, path, path_end - path) < 0 ||
        put_part(key, status, 3) < 0)
        return -1;
    return 1;
}

static PyObject *key_tuple(const char *key, Py_ssize_t len) {
    PyObject *tuple = PyTuple_New(ACCESS_PARTS);
    if (!tuple) return NULL;
    Py_ssize_t at = 0;
    for (int i = 0; i < ACCESS_PARTS; i++) {
        uint32_t n;
        if (at + 4 > len) { Py_DECREF(tuple); PyErr_SetString(PyExc_SystemError, "bad access key"); return NULL; }
        memcpy(&n, key + at, 4);
        at += 4;
        if (at + (Py_ssize_t)n > len) { Py_DECREF(tuple); PyErr_SetString(PyExc_SystemError, "bad access key"); return NULL; }
        PyObject *part = PyBytes_FromStringAndSize(key + at, n);
        if (!part) { Py_DECREF(tuple); return NULL; }
        PyTuple_SET_ITEM(tuple, i, part);
        at += n;
    }
    return tuple;
}

static PyObject *access_counts(PyObject *self, PyObject *args) {
    Py_buffer view;
    PyObject *counts;
    if (!PyArg_ParseTuple(args, "y*O!", &view, &PyDict_Type, &counts)) return NULL;
    const unsigned char *data = view.buf;
    const unsigned char *end = data + view.len;
    Buf key = {0}, declined = {0};
    AccessTable table = {0};
    PyObject *result = NULL;
    Py_ssize_t counted = 0;
    const unsigned char *pos = data;
    while (pos < end) {
        const unsigned char *hit = memmem(pos, (size_t)(end - pos), " HTTP/", 6);
        if (!hit) break;
        const unsigned char *s = hit;
        while (s > data && s[-1] != '\n') s--;
        const unsigned char *e = memchr(hit, '\n', (size_t)(end - hit));
        if (!e) e = end;
        pos = e;
        int parsed = parse_access_line(s, e, &key);
        if (parsed < 0) goto done;
        if (parsed == 0) {
            int64_t start = s - data;
            if (buf_put(&declined, &start, 8) < 0) goto done;
            continue;
        }
        if (table_add(&table, key.data, key.used) < 0) goto done;
        counted++;
    }
    for (Py_ssize_t i = 0; i < table.used; i++) {
        AccessEntry *slot = &table.entries[i];
        PyObject *k = key_tuple(slot->key, slot->key_len);
        if (!k) goto done;
        PyObject *old = PyDict_GetItemWithError(counts, k);
        if (!old && PyErr_Occurred()) { Py_DECREF(k); goto done; }
        Py_ssize_t total = slot->count;
        if (old) {
            Py_ssize_t before = PyLong_AsSsize_t(old);
            if (before == -1 && PyErr_Occurred()) { Py_DECREF(k); goto done; }
            total += before;
        }
        PyObject *v = PyLong_FromSsize_t(total);
        if (!v || PyDict_SetItem(counts, k, v) < 0) { Py_XDECREF(v); Py_DECREF(k); goto done; }
        Py_DECREF(v);
        Py_DECREF(k);
    }
    result = Py_BuildValue("(nN)", counted, buf_bytes(&declined));
done:
    buf_free(&key);
    buf_free(&declined);
    table_free(&table);
    PyBuffer_Release(&view);
    return result;
}

/* Lines of a chunk (newlines), how many of them start with `prefix`, and for each of the
 * ascending offsets in `starts` the number of newlines before it, in one pass. */
static PyObject *count_lines(PyObject *self, PyObject *args) {
    Py_buffer view, prefix;
    PyObject *starts_arg;
    if (!PyArg_ParseTuple(args, "y*y*O", &view, &prefix, &starts_arg)) return NULL;
    PyObject *result = NULL, *before = NULL;
    Py_ssize_t *starts = NULL;
    PyObject *seq = PySequence_Fast(starts_arg, "starts must be a sequence of ints");
    if (!seq) goto done;
    Py_ssize_t n_starts = PySequence_Fast_GET_SIZE(seq);
    starts = PyMem_Malloc((size_t)(n_starts ? n_starts : 1) * sizeof(Py_ssize_t));
    if (!starts) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < n_starts; i++) {
        starts[i] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i));
        if (starts[i] == -1 && PyErr_Occurred()) goto done;
        if (i && starts[i] < starts[i - 1]) {
            PyErr_SetString(PyExc_ValueError, "starts must be ascending");
            goto done;
        }
    }
    before = PyList_New(n_starts);
    if (!before) goto done;
    const unsigned char *data = view.buf, *end = data + view.len;
    const unsigned char *want = prefix.buf;
    Py_ssize_t want_len = prefix.len;
    Py_ssize_t lines = 0, starting = 0, next = 0;
    const unsigned char *line = data;
    while (line < end) {
        if (want_len > 0 && end - line >= want_len && line[0] == want[0] &&
            memcmp(line, want, (size_t)want_len) == 0)
            starting++;
        const unsigned char *newline = memchr(line, '\n', (size_t)(end - line));
        if (!newline) break;
        /* every start up to this newline lies on line number `lines` (0-based) */
        while (next < n_starts && starts[next] <= newline - data) {
            PyObject *value = PyLong_FromSsize_t(lines);
            if (!value) goto done;
            PyList_SET_ITEM(before, next++, value);
        }
        lines++;
        line = newline + 1;
    }
    while (next < n_starts) {  /* starts past the last newline */
        PyObject *value = PyLong_FromSsize_t(lines);
        if (!value) goto done;
        PyList_SET_ITEM(before, next++, value);
    }
    result = Py_BuildValue("(nnO)", lines, starting, before);
done:
    Py_XDECREF(before);
    Py_XDECREF(seq);
    PyMem_Free(starts);
    PyBuffer_Release(&view);
    PyBuffer_Release(&prefix);
    return result;
}

static PyMethodDef methods[] = {
    {"batch_lines", batch_lines, METH_VARARGS,
     "batch_lines(data, fmt, layouts, origins) -> (starts i8, layout i4, time_ns i8, dp i4, tp i4, pp i4,\n"
     "iter i8, value_start i8, values f8, value_kinds u1, origin i4, declined_starts i8), each as bytes.\n"
     "fmt 0 = plain, 1 = short-iso. layouts maps b'P'|b'D' + label\\0... to ids and origins maps\n"
     "host\\0unit to ids; both are updated in place. time_ns is UTC for short-iso and naive for plain\n"
     "(INT64_MIN when the line has no time); ranks and iter are -1 when absent; value kind 1 = True/False."},
    {"access_counts", access_counts, METH_VARARGS,
     "access_counts(data, counts) -> (counted, declined_starts i8 bytes). short-iso only: adds each\n"
     "canonical uvicorn access line to counts[(minute, zone, host, unit, method, path, status)]."},
    {"count_lines", count_lines, METH_VARARGS,
     "count_lines(data, prefix, starts) -> (newlines, lines starting with prefix, [newlines before\n"
     "each of the ascending offsets in starts]); a last line without a newline counts toward the\n"
     "second number only."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastscan", "Compiled fast path of forensics.logs.scanner.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastscan(void) { return PyModule_Create(&module); }
