// tiktoken.cjs — the independent side of the GPT-2 tokenizer tests and of
// bench/tokenizer.sh: js-tiktoken's "gpt2" encoding under node.
//
//   node tiktoken.cjs compare TEXT FILE.tok  every token of dtrain's .tok
//                                            equals js-tiktoken's encoding
//                                            of TEXT, and decodes back to it
//   node tiktoken.cjs time TEXT [RUNS]       median seconds of encoding TEXT
//   node tiktoken.cjs unicode OUT [BYTES]    write a Unicode-heavy text
//   node tiktoken.cjs merges DIR TEXT FILE.tok  the .tok equals GPT-2's
//                                            original pair-merge BPE (its
//                                            encoder.py) with DIR's
//                                            encoder.json and vocab.bpe
//
// js-tiktoken is found in $DT_NODE_MODULES (scripts/get-gpt2-tokenizer.sh --js).
"use strict";
const fs = require("fs");
const path = require("path");
const { createRequire } = require("module");

function tiktoken() {
    const req = createRequire(path.join(process.env.DT_NODE_MODULES || ".", "x.js"));
    return req("js-tiktoken").getEncoding("gpt2");
}

// The text as node reads it (UTF-8); encode() refuses special tokens.
function encode(enc, text) { return enc.encode(text, [], []); }

function readTok(tokPath, wantV) {
    const tok = fs.readFileSync(tokPath);
    if (tok.toString("latin1", 0, 8) !== "DTTOKENS") throw new Error(tokPath + ": not a .tok file");
    const kind = tok.readUInt32LE(12), vocab = tok.readUInt32LE(16);
    const count = Number(tok.readBigUInt64LE(24));
    if (kind !== 3 || (wantV && vocab !== wantV)) throw new Error(`${tokPath}: kind ${kind}, V ${vocab}`);
    const ours = new Uint16Array(count);
    for (let i = 0; i < count; i++) ours[i] = tok.readUInt16LE(64 + 2 * i);
    return ours;
}

function firstDiff(ours, theirs) {
    const n = Math.min(ours.length, theirs.length);
    for (let i = 0; i < n; i++)
        if (ours[i] !== theirs[i]) {
            const ctx = (a) => Array.from(a.slice(Math.max(0, i - 5), i + 5)).join(" ");
            return `at token ${i}: dtrain ${ctx(ours)} | reference ${ctx(theirs)}`;
        }
    return ours.length === theirs.length ? null : `dtrain ${ours.length} tokens, reference ${theirs.length}`;
}

// GPT-2's encoder.py, as published: pieces by the pattern, then the
// lowest-ranked pair of vocab.bpe merged first, all of its occurrences.
function gpt2Original(dir, text) {
    const encoder = JSON.parse(fs.readFileSync(path.join(dir, "encoder.json"), "utf8"));
    const merges = fs.readFileSync(path.join(dir, "vocab.bpe"), "utf8").split("\n").slice(1)
        .filter((l) => l.length).map((l) => l.split(" "));
    const ranks = new Map(merges.map((m, i) => [m[0] + " " + m[1], i]));
    const bs = [];
    for (let c = 33; c <= 126; c++) bs.push(c);
    for (let c = 161; c <= 172; c++) bs.push(c);
    for (let c = 174; c <= 255; c++) bs.push(c);
    const cs = bs.slice();
    let n = 0;
    for (let b = 0; b < 256; b++) if (!bs.includes(b)) { bs.push(b); cs.push(256 + n++); }
    const byteEnc = new Map(bs.map((b, i) => [b, String.fromCodePoint(cs[i])]));
    const pat = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;
    const cache = new Map(), out = [];
    for (const m of text.matchAll(pat)) {
        const token = Array.from(Buffer.from(m[0], "utf8")).map((b) => byteEnc.get(b)).join("");
        let ids = cache.get(token);
        if (!ids) {
            let word = Array.from(token);
            while (word.length > 1) {
                let best = null, bestRank = Infinity;
                for (let i = 0; i + 1 < word.length; i++) {
                    const r = ranks.get(word[i] + " " + word[i + 1]);
                    if (r !== undefined && r < bestRank) { bestRank = r; best = [word[i], word[i + 1]]; }
                }
                if (!best) break;
                const next = [];
                for (let i = 0; i < word.length;) {
                    if (i + 1 < word.length && word[i] === best[0] && word[i + 1] === best[1]) {
                        next.push(best[0] + best[1]);
                        i += 2;
                    } else next.push(word[i++]);
                }
                word = next;
            }
            ids = word.map((w) => encoder[w]);
            cache.set(token, ids);
        }
        out.push(...ids);
    }
    return out;
}

function merges(dir, textPath, tokPath) {
    const text = fs.readFileSync(textPath, "utf8");
    const ours = readTok(tokPath, 0);
    const d = firstDiff(ours, gpt2Original(dir, text));
    if (d) { console.log("MISMATCH " + d); process.exit(1); }
    console.log(`equal: ${ours.length} tokens of ${Buffer.byteLength(text)} bytes, GPT-2's pair merges of ${dir}`);
}

function compare(textPath, tokPath) {
    const text = fs.readFileSync(textPath, "utf8");
    const ours = readTok(tokPath, 50257);
    const count = ours.length;
    const enc = tiktoken();
    const theirs = encode(enc, text);
    const n = Math.min(ours.length, theirs.length);
    for (let i = 0; i < n; i++) {
        if (ours[i] !== theirs[i]) {
            const ctx = (a) => Array.from(a.slice(Math.max(0, i - 5), i + 5)).join(" ");
            console.log(`MISMATCH at token ${i}: dtrain ${ctx(ours)} | js-tiktoken ${ctx(theirs)}`);
            console.log("around: " + JSON.stringify(enc.decode(theirs.slice(Math.max(0, i - 5), i + 5))));
            process.exit(1);
        }
    }
    if (ours.length !== theirs.length) {
        console.log(`MISMATCH: dtrain ${ours.length} tokens, js-tiktoken ${theirs.length}`);
        process.exit(1);
    }
    if (enc.decode(Array.from(ours)) !== text) {
        console.log("MISMATCH: dtrain's tokens do not decode back to the text");
        process.exit(1);
    }
    console.log(`equal: ${count} tokens of ${Buffer.byteLength(text)} bytes (${path.basename(textPath)})`);
}

function time(textPath, runs) {
    const text = fs.readFileSync(textPath, "utf8");
    const enc = tiktoken();
    encode(enc, text.slice(0, 100000)); // warm up the JIT
    const t = [];
    let n = 0;
    for (let r = 0; r < runs; r++) {
        const t0 = process.hrtime.bigint();
        n = encode(enc, text).length;
        t.push(Number(process.hrtime.bigint() - t0) * 1e-9);
    }
    t.sort((a, b) => a - b);
    console.log(JSON.stringify({ seconds: t[Math.floor(runs / 2)], tokens: n, bytes: Buffer.byteLength(text) }));
}

// Words from many scripts and every class of GPT-2's pattern: letters of
// Latin (with accents and combining marks), Greek, Cyrillic, Armenian,
// Hebrew, Arabic, Devanagari, Thai, Hangul, kana and CJK; digits of
// several scripts and other numbers (Roman numerals, fractions,
// superscripts); symbols, punctuation and emoji (with ZWJ sequences and
// skin tones); contractions; and the spaces ECMAScript's \s knows (NBSP,
// ideographic, thin, line separators, BOM), in runs and at line ends.
function unicode(out, bytes) {
    const pools = [
        [0x41, 0x5a], [0x61, 0x7a], [0xc0, 0x24f], [0x370, 0x3ff], [0x400, 0x4ff], [0x531, 0x587],
        [0x5d0, 0x5ea], [0x620, 0x64a], [0x904, 0x939], [0xe01, 0xe30], [0xac00, 0xd7a3],
        [0x3041, 0x3096], [0x30a1, 0x30fa], [0x4e00, 0x9fff], [0x20000, 0x2a6df],
    ];
    const marks = [[0x300, 0x36f], [0x93e, 0x94c], [0x64b, 0x652]];
    const digits = [[0x30, 0x39], [0x660, 0x669], [0x966, 0x96f], [0xff10, 0xff19], [0x2160, 0x217f],
        [0xbc, 0xbe], [0xb2, 0xb3], [0x2070, 0x2079]];
    const symbols = [[0x21, 0x2f], [0x3a, 0x40], [0x5b, 0x60], [0x7b, 0x7e], [0xa1, 0xbf],
        [0x2010, 0x2027], [0x2190, 0x21ff], [0x2200, 0x22ff], [0x1f300, 0x1f5ff], [0x1f600, 0x1f64f],
        [0x3001, 0x3003], [0xff01, 0xff0f]];
    const spaces = [" ", " ", " ", "  ", "   ", "\n", "\n\n", "\t", "\u00a0", "\u3000", "\u2009",
        "\u2028", "\ufeff", " \n", "\r\n", "\u200a", "\u1680", "\u202f", "\u205f", "\u000b"];
    const extra = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "''", "'x", "\u{1F44D}\u{1F3FD}",
        "\u{1F468}\u200d\u{1F469}\u200d\u{1F467}", "\u00e9", "e\u0301", "\u2019s", "<|endoftext", "..."];
    let seed = 12345;
    const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
    const pick = (rs) => { const r = rs[rnd(rs.length)]; return String.fromCodePoint(r[0] + rnd(r[1] - r[0] + 1)); };
    let s = "Größe naïve café — “quoted” ‘words’ don't we'll I'm they've she'd it's 12,345.67 ½ ² Ⅻ\n" +
        "Ελληνικά Русский язык Հայերեն עברית العربية हिन्दी ไทย 한국어 日本語 中文 😀👍🏽\n";
    while (Buffer.byteLength(s) < bytes) {
        const k = rnd(10);
        let w = "";
        const len = 1 + rnd(8);
        for (let i = 0; i < len; i++)
            w += k < 5 ? pick(pools) + (rnd(6) === 0 ? pick(marks) : "") : k < 7 ? pick(digits) : pick(symbols);
        if (rnd(8) === 0) w += extra[rnd(extra.length)];
        s += w + spaces[rnd(spaces.length)];
    }
    fs.writeFileSync(out, s);
}

const [cmd, a, b] = process.argv.slice(2);
if (cmd === "compare") compare(a, b);
else if (cmd === "merges") merges(a, b, process.argv[5]);
else if (cmd === "time") time(a, Number(b || 5));
else if (cmd === "unicode") unicode(a, Number(b || 300000));
else { console.error("usage: tiktoken.cjs compare|time|unicode ..."); process.exit(2); }
