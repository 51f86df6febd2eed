#!/usr/bin/env python3
"""Writes a directory of text as BPE token shards for data.format = "tokens".

The text is read as `distjax data prepare` reads it (data::read_text_files): the regular
files of the directory in sorted name order, without ".dat" indexes, ".u8" links and symbolic
links, concatenated; the last --validation-fraction of the BYTES is the validation split
(data::ByteCorpus::from_bytes). So the validation text is the byte-level run's, to the byte,
and bits per byte compare.

A document ends at a line that is only "%" (the fortune files' separator, kept in the
document) or at the end of a file; a file without such lines is one document. Each document
is encoded and followed by the end-of-text token <|endoftext|>; the split boundary cuts the
document it falls in into two. No byte is dropped or changed: a byte-level BPE is lossless, so
the byte lengths of a split's tokens add up to the split's bytes (the end-of-text token counts
0 bytes). Bytes that are not valid UTF-8 (a character cut by the split) are written as the
single-byte tokens the byte-level alphabet holds.

The tokenizer is a byte-level BPE (Hugging Face `tokenizers`: ByteLevel pre-tokenizer and
decoder) trained on the TRAINING split with --vocab ids, or read from --tokenizer; it is
written as tokenizer.json beside the shards (data.tokenizer reads it for bits per byte).
The shards are llm.c's: train_000000.bin, ..., val_000000.bin, ..., a header of 256
little-endian int32 (magic 20240520, version 1 for uint16 tokens or 2 for uint32, the token
count), then the tokens; at most --shard-tokens each. Nothing is fetched.

    .venv-test/bin/python tools/prepare_tokens.py --out data/fortunes_bpe --vocab 4096
"""

import argparse
import os
import struct
import sys
from array import array

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

FORTUNES_DIR = "/usr/share/games/fortunes"
EOT = "<|endoftext|>"
MAGIC = 20240520


def text_files(directory):
    """The files data::read_text_files reads, in its order."""
    files = []
    if os.path.isdir(directory):
        for name in os.listdir(directory):
            path = os.path.join(directory, name)
            if os.path.splitext(name)[1] in (".dat", ".u8"):
                continue
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            files.append(path)
    if not files:
        sys.exit(f'[prepare_tokens] no text files in "{directory}"; install the Debian package '
                 "`fortunes` (apt-get install fortunes) or pass a directory of text files")
    # data::read_text_files sorts std::filesystem::path values: byte order of the full paths.
    return sorted(files, key=os.fsencode)


def documents_of(data):
    """The documents of one file's bytes: each ends after a line that is only "%", or at
    the end of the file. Their concatenation is `data`."""
    docs, start, at = [], 0, 0
    while at < len(data):
        end = data.find(b"\n", at)
        end = len(data) if end < 0 else end + 1
        if data[at:end].rstrip(b"\r\n") == b"%":
            docs.append(data[start:end])
            start = end
        at = end
    if start < len(data):
        docs.append(data[start:])
    return docs


def split_documents(files, validation_fraction):
    """(train documents, validation documents, train bytes, validation bytes), split by
    position as data::ByteCorpus::from_bytes splits the concatenation."""
    per_file = [open(f, "rb").read() for f in files]
    total = sum(len(b) for b in per_file)
    n_val = int(total * validation_fraction)  # C++: static_cast<int64_t>(double(n) * fraction)
    if not (0.0 < validation_fraction < 1.0) or n_val < 1 or total - n_val < 1:
        sys.exit(f"[prepare_tokens] {total} bytes are too few to split with "
                 f"--validation-fraction {validation_fraction}")
    cut = total - n_val
    train, val, at = [], [], 0
    for data in per_file:
        for doc in documents_of(data):
            if at + len(doc) <= cut:
                train.append(doc)
            elif at >= cut:
                val.append(doc)
            else:
                train.append(doc[:cut - at])
                val.append(doc[cut - at:])
            at += len(doc)
    return train, val, cut, n_val


def byte_level_bpe(train_docs, vocab):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator((d.decode("utf-8", "ignore") for d in train_docs), trainer)
    return tok


def byte_tokens(tok):
    """id of the single-byte token of each byte value (the ByteLevel alphabet)."""
    # GPT-2's bytes_to_unicode, the characters ByteLevel writes bytes as.
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) +
                 list(range(ord("®"), ord("ÿ") + 1)))
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    ids = [tok.token_to_id(chars[b]) for b in range(256)]
    if any(i is None for i in ids):
        sys.exit("[prepare_tokens] the tokenizer is not a byte-level BPE: its vocabulary lacks "
                 "some of the 256 single-byte tokens")
    return ids


def encode(tok, docs, eot, single):
    """The tokens of `docs`, each document followed by `eot`."""
    pieces = []  # per document: list of (text run or None, raw bytes of invalid UTF-8)
    texts = []
    for d in docs:
        s = d.decode("utf-8", "surrogateescape")
        runs, run = [], []
        for ch in s:
            if 0xDC80 <= ord(ch) <= 0xDCFF:  # a byte that is not UTF-8: its own token
                if run:
                    runs.append(("".join(run), None))
                    run = []
                runs.append((None, ord(ch) - 0xDC00))
            else:
                run.append(ch)
        if run:
            runs.append(("".join(run), None))
        pieces.append(runs)
        texts.extend(t for t, _ in runs if t is not None)
    encoded = iter(tok.encode_batch(texts, add_special_tokens=False))
    out = array("I")
    for runs in pieces:
        for text, byte in runs:
            if text is not None:
                out.extend(next(encoded).ids)
            else:
                out.append(single[byte])
        out.append(eot)
    return out


def write_shards(tokens, out_dir, split, shard_tokens, version):
    written = []
    for i, start in enumerate(range(0, max(len(tokens), 1), shard_tokens)):
        chunk = tokens[start:start + shard_tokens]
        path = os.path.join(out_dir, f"{split}_{i:06d}.bin")
        header = array("i", [0] * 256)
        header[0], header[1], header[2] = MAGIC, version, len(chunk)
        body = array("H" if version == 1 else "I", chunk)
        if sys.byteorder != "little":
            header.byteswap()
            body.byteswap()
        with open(path, "wb") as f:
            f.write(header.tobytes())
            f.write(body.tobytes())
        written.append(path)
    return written


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--text", default=FORTUNES_DIR,
                   help="directory of text files (default: the fortunes)")
    p.add_argument("--out", required=True, help="directory the shards and tokenizer.json go to")
    p.add_argument("--vocab", type=int, default=4096,
                   help="ids of the BPE trained on the training split (default 4096)")
    p.add_argument("--tokenizer", help="a tokenizer.json to use instead of training one")
    p.add_argument("--validation-fraction", type=float, default=0.05,
                   help="the last fraction of the bytes held out as the validation split")
    p.add_argument("--shard-tokens", type=int, default=100 << 20, help="tokens per shard at most")
    a = p.parse_args()
    if a.shard_tokens < 1:
        sys.exit("[prepare_tokens] --shard-tokens must be >= 1")

    train_docs, val_docs, train_bytes, val_bytes = split_documents(
        text_files(a.text), a.validation_fraction)
    if a.tokenizer:
        if not os.path.isfile(a.tokenizer):
            sys.exit(f'[prepare_tokens] no tokenizer file "{a.tokenizer}"')
        tok = Tokenizer.from_file(a.tokenizer)
    else:
        if a.vocab < 257:
            sys.exit(f"[prepare_tokens] --vocab {a.vocab}: a byte-level BPE needs more than 256 "
                     "ids (the bytes and <|endoftext|>)")
        tok = byte_level_bpe(train_docs, a.vocab)
    eot = tok.token_to_id(EOT)
    if eot is None:
        sys.exit(f'[prepare_tokens] the tokenizer has no special token "{EOT}"')
    single = byte_tokens(tok)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    version = 1 if vocab <= 1 << 16 else 2

    os.makedirs(a.out, exist_ok=True)
    tok.save(os.path.join(a.out, "tokenizer.json"))
    for split, docs, nbytes in (("train", train_docs, train_bytes), ("val", val_docs, val_bytes)):
        tokens = encode(tok, docs, eot, single)
        files = write_shards(tokens, a.out, split, a.shard_tokens, version)
        print(f"{split}: {len(tokens)} tokens ({len(docs)} documents, each ended by {EOT}) "
              f"of {nbytes} bytes, {nbytes / len(tokens):.3f} bytes per token, in "
              f"{len(files)} shard(s) {files[0]}{' ...' if len(files) > 1 else ''}")
    print(f"Tokenizer: byte-level BPE of {vocab} ids, {os.path.join(a.out, 'tokenizer.json')}")
    print("Train on them with:\n  --set data.format=tokens "
          f"--set data.train='{a.out}/train_*.bin' --set data.val='{a.out}/val_*.bin' "
          f"--set data.tokenizer='{a.out}/tokenizer.json' --set model.vocab={vocab}")


if __name__ == "__main__":
    main()
