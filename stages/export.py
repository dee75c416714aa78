"""export: ship a retriever as artifacts other stacks load without retrctl, each checked against the model.

``retrctl export MODEL -o DIST [--format st,onnx,onnx-int8] [--dim N [--force]]`` writes, atomically (a failed
check leaves no DIST):

| format | what | parity with retrctl's PyTorch encoder (fp32), on sample texts as queries and passages |
|---|---|---|
| ``st`` | DIST itself: a sentence-transformers dir (stock ``SentenceTransformer(DIST)``) | max abs diff ≤ 1e-5 |
| ``st --dtype fp16`` / ``bf16`` | the same, weights cast after any LoRA merge; vs the fp32 model's vectors | min cosine ≥ 0.999 / 0.99 |
| ``onnx`` | ``DIST/onnx/model.onnx``: token ids → pooled, truncated, normalised vector | min cosine ≥ 0.9999 |
| ``onnx-int8`` | ``DIST/onnx/model_int8.onnx``: dynamic int8, MatMul weights per channel | mean cosine ≥ 0.99 |
| ``sparse-encoder`` | ``DIST/sparse-encoder``: an encoder's symmetric sparse head as stock ``SparseEncoder`` (retrctl/export/sparse_st.py) | max abs diff of a term weight ≤ 1e-4 |
| ``multi-vector-encoder`` | ``DIST/multi-vector-encoder``: an encoder's colbert head as stock ``MultiVectorEncoder`` (retrctl/export/multivector_st.py) | max abs diff of a token vector ≤ 1e-4 |

plus ``export.json`` (the figures) and a model card (README.md). A model's sparse head (``sparse/config.json``)
ships with the ``st`` dir. ``retrctl export IDX -o DIST --format json-vectors`` writes a *sparse index*'s docs as
Anserini's JsonVectorCollection instead (``export_json_vectors``: the Pyserini command is in its docstring). ``DIST/onnx`` holds its tokenizer and
retrctl.json, so ``retrctl index --model DIST/onnx`` (or the int8 file) encodes with onnxruntime.

``--dim N``: Matryoshka, truncate to the first N then L2-renormalise, in every format. Refused above the model's
dim, and unless the model was trained with N (train_config.json ``mrl_dims``) or ``--force`` is given.

Decoders: bidirectional attention is saved as ``is_causal: false`` in config.json, which transformers reads, so a
stock loader gets it; EOS pooling appends EOS in retrctl's tokenizing, which a stock tokenizer may not do — the
``st`` check catches it (and the card says so) rather than shipping a silent difference.

A PEFT adapter-only dir (adapter_config.json, no config.json) is merged into its base in fp32 first and must
reproduce the adapter model to 1e-5 (retrctl/export/lora.py); ``retrctl train --lora-r`` outputs are merged already.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import click
import numpy as np

from retrctl import records
from retrctl.errors import UsageError
from retrctl.options import encoder_overrides, options
from retrctl.stage import stage

log = logging.getLogger("retrctl.export")

FORMATS = ("st", "onnx", "onnx-int8", "sparse-encoder", "multi-vector-encoder")
BOUNDS = {"st": ("max_abs_diff", 1e-5), "onnx": ("min_cos", 0.9999), "onnx-int8": ("mean_cos", 0.99),
          "sparse-encoder": ("max_abs_diff", 1e-4),  # term weights reach ~10: float32 rounding of the logits
          "multi-vector-encoder": ("max_abs_diff", 1e-4),  # unit token vectors
          # a cast st export against the fp32 model: fp16 keeps 10 mantissa bits, bf16 7 (its range is fp32's)
          "st-fp16": ("min_cos", 0.999), "st-bf16": ("min_cos", 0.99)}


def parse_formats(value: str) -> list[str]:
    got = [f.strip() for f in value.split(",") if f.strip()]
    if got == ["json-vectors"]:
        return got
    bad = [f for f in got if f not in FORMATS]
    if bad or not got:
        raise UsageError(f"{value!r}: choose from {', '.join(FORMATS)} (comma-separated), or json-vectors "
                         "alone (of a sparse index)", flag="--format")
    return [f for f in FORMATS if f in got]


def export_json_vectors(source, output) -> Path:
    """A sparse index's docs as Anserini's JsonVectorCollection (``DIST/docs.jsonl.gz``), for Lucene to serve:

        python -m pyserini.index.lucene --collection JsonVectorCollection --input DIST --index LUCENE \\
            --generator DefaultLuceneDocumentGenerator --impact --pretokenized --threads 2

    Queries for ``pyserini.search.lucene --impact --pretokenized``: the model tokenizer's tokens joined by spaces
    (token counts, as the index's own queries)."""
    from retrctl.indexes import SparseIndex, open_index

    out = Path(output)
    records.check_outputs([output], [source], dir_output=True)
    records.check_own_dir(out, "export.json", "a retrctl export")
    idx = open_index(source)
    if not isinstance(idx, SparseIndex):
        raise UsageError(f"{source}: a {idx.name} index; json-vectors exports a sparse one", flag="--format")
    with records.atomic_dir(out, resume=False) as tmp:
        n = idx.write_json_vectors(tmp / "docs.jsonl.gz")
        (tmp / "export.json").write_text(json.dumps({"source": str(source), "format": "json-vectors", "docs": n,
                                                     "impact_scale": 100, "versions": records.versions()}, indent=2))
        tmp.chmod(0o755)
    log.info("wrote %s: %d docs as a JsonVectorCollection", out, n)
    return out


def check_dim(enc, root: Path, dim: int, force: bool) -> None:
    """--dim: within the model's dim, and one the model was trained to truncate to (or --force)."""
    full = enc.config.dims or enc.model.config.hidden_size
    if dim > full:
        raise UsageError(f"{dim} is above the model's dim ({full})", flag="--dim")
    train = root / "train_config.json"
    mrl = (json.loads(train.read_text()).get("mrl_dims") if train.is_file() else None) or []
    if dim != full and dim not in mrl and not force:
        where = f"trained with mrl_dims {mrl}" if mrl else "not trained with Matryoshka (no mrl_dims in train_config.json)"
        raise UsageError(f"{dim}: the model was {where}; truncating it may lose much quality (--force to do it anyway)",
                         flag="--dim")


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def _checked(source, name: str, figures: dict) -> str:
    """Raise (exit 2, nothing written) when ``figures`` miss the format's bound; else the figures as one line."""
    key, bound = BOUNDS[name]
    value = figures[key]
    ok = value <= bound if key == "max_abs_diff" else value >= bound
    line = ", ".join(f"{k} {v:.6g}" for k, v in figures.items())
    click.echo(f"export: {name} parity: {line}", err=True)
    if not ok:
        raise records.RecordError(source, message=f"export {name} failed its parity check: {key} {value:.6g} "
                                  f"{'>' if key == 'max_abs_diff' else '<'} {bound} (nothing written)")
    return line


def export(source, *, output, formats: str = "st,onnx,onnx-int8", dim: int | None = None, force: bool = False,
           eval_results=(), encoder_settings: dict | None = None) -> Path:
    """Export ``source`` to ``output`` (see the module docstring). Returns the output dir."""
    from retrctl.export import SAMPLE_TEXTS, card, lora, multivector_st, require_runtime, sparse_st, st
    from retrctl.hashing import weights_fingerprint
    from retrctl.models import Encoder, lookup, resolve

    names = parse_formats(formats) if isinstance(formats, str) else list(formats)
    if names == ["json-vectors"]:
        return export_json_vectors(source, output)
    out = Path(output)
    records.check_outputs([output], [source], dir_output=True)
    records.check_own_dir(out, "export.json", "a retrctl export")
    if any(n.startswith("onnx") for n in names):
        require_runtime()
    settings = {k: v for k, v in (encoder_settings or {}).items() if k not in ("dtype", "device")}
    cast = (encoder_settings or {}).get("dtype") or "fp32"
    if cast != "fp32" and names != ["st"]:
        raise UsageError(f"{cast} applies to --format st only (ONNX is exported in fp32; onnx-int8 quantises it)",
                         flag="--dtype")
    root = resolve(source)
    evals = card.eval_results(eval_results, root)  # bad input refused before any work
    texts = list(SAMPLE_TEXTS)
    merged = None
    if lora.is_adapter(root):  # merged in fp32 and checked against the adapter model
        enc, merged = lora.load_merged(root, texts, **settings)
    else:
        enc = Encoder.load(source, device="cpu", dtype="fp32", **settings)
    if dim is not None:
        check_dim(enc, root, dim, force)
        enc.config.dims = dim
    heads = [(n, f) for n, f in (("sparse-encoder", sparse_st), ("multi-vector-encoder", multivector_st)) if n in names]
    for _, head_format in heads:
        head_format.check(enc)
    report = {"source": str(source), "source_fingerprint": weights_fingerprint(root), "retrctl": records.versions().get("retrctl"),
              "encoder": {k: v for k, v in enc.describe().items() if k not in ("model", "dim")}, "dim": enc.dim,
              "sample_texts": len(texts), "formats": {}, "notes": [], "lora": merged, "versions": records.versions()}
    ref = {kind: enc.encode(texts, kind) for kind in ("query", "passage")}
    with records.atomic_dir(out, resume=False) as tmp:
        if "st" in names:
            bound, cast_info = "st", {}
            if cast != "fp32":  # after any LoRA merge (in fp32); checked against the fp32 vectors
                import torch

                from retrctl.models.config import DTYPES

                enc.model.to(getattr(torch, DTYPES[cast]))
                bound, cast_info = f"st-{cast}", {"dtype": cast}
            st.write(enc, tmp)
            figures = st.stock_parity(enc, tmp, texts, ref=ref if cast_info else None)
            report["formats"]["st"] = {"path": ".", "bytes": _size(tmp), **cast_info,
                                       "parity": _checked(source, bound, figures), **figures}
        if "st" in names and enc.token_lookup:  # LightRetriever's token table: Encoder.save builds it from these weights
            report["formats"]["token-lookup"] = {"path": lookup.TABLE_DIR, "bytes": _size(tmp / lookup.TABLE_DIR),
                                                 "parity": "built from the exported weights (Encoder.save)"}
        if any(n.startswith("onnx") for n in names):
            _export_onnx(enc, tmp / "onnx", names, ref, texts, source, report)
        for name, head_format in heads:  # a head as a stock sentence-transformers model of its kind
            d = tmp / head_format.SUBDIR
            head_format.write(enc, d)
            figures = head_format.stock_parity(enc, d, texts)
            report["formats"][name] = {"path": head_format.SUBDIR, "bytes": _size(d),
                                       "parity": _checked(source, name, figures), **figures}
        report["notes"] += notes(enc)
        (tmp / "export.json").write_text(json.dumps(report, indent=2, default=str))
        report["eval"] = evals
        (tmp / "README.md").write_text(card.render(root, str(source), report, evals))
        tmp.chmod(0o755)  # a private temp dir until now; the export is for others to read
    log.info("wrote %s (%s)", out, ", ".join(names))
    return out


def _export_onnx(enc, d: Path, names: list[str], ref: dict, texts: list[str], source, report: dict) -> None:
    import dataclasses

    from retrctl.export import onnx
    from retrctl.export.st import cosines
    from retrctl.models.runtime import OnnxEncoder

    d.mkdir()
    enc.tokenizer.save_pretrained(d)
    (d / "retrctl.json").write_text(json.dumps(dataclasses.asdict(enc.config), indent=2))
    fp32 = onnx.export_fp32(enc, d / "model.onnx")
    files = {"onnx": fp32}
    if "onnx-int8" in names:
        files["onnx-int8"] = onnx.quantize_int8(fp32, d / "model_int8.onnx")
    for name, path in files.items():
        runtime = OnnxEncoder.load(path)
        cos = np.concatenate([cosines(ref[k], runtime.encode(texts, k)) for k in ("query", "passage")])
        figures = {"min_cos": float(cos.min()), "mean_cos": float(cos.mean())}
        if name == "onnx":
            figures["max_abs_diff"] = float(max(np.abs(ref[k] - runtime.encode(texts, k)).max() for k in ref))
        if name in names:
            report["formats"][name] = {"path": f"onnx/{path.name}", "bytes": path.stat().st_size,
                                       "parity": _checked(source, name, figures), **figures}
    if "onnx" not in names:  # only the int8 graph was asked for
        fp32.unlink()


def notes(enc) -> list[str]:
    from retrctl.models import is_decoder

    c = enc.config
    out = []
    if c.query_max_len != c.passage_max_len:
        out.append(f"queries are cut at {c.query_max_len} tokens, passages at {c.passage_max_len}: saved as query_length and "
                   "document_length in sentence_bert_config.json, which sentence-transformers 6 applies in encode_query and "
                   "encode_document (plain encode() cuts every text at max_seq_length, the passage cap; releases before "
                   "these keys refuse the config); the ONNX runtime reads the caps from retrctl.json.")
    if is_decoder(enc.model.config) or getattr(enc.model.config, "is_causal", None) is not None:
        out.append("decoder with bidirectional attention: saved as is_causal=false in config.json, which transformers reads, "
                   "so stock AutoModel and SentenceTransformer run it bidirectionally (the st check above compared them)"
                   if c.bidirectional else "decoder with causal attention.")
        if c.pooling == "eos":
            out.append("EOS pooling: retrctl appends the EOS token when tokenizing; stock sentence-transformers does so only "
                       "if the tokenizer itself appends it (the st parity check above ran on this tokenizer).")
    out.append("ONNX graphs run onnxruntime on CPU; the int8 graph quantises MatMul weights per channel (dynamic).")
    if getattr(enc, "sparse", None) is not None:
        out.append("the sparse head ships as sparse/config.json (its projection is the input embeddings, saved with the "
                   "model): `retrctl index --method sparse --model DIST`; the ONNX graphs carry the dense head only; "
                   "`--format sparse-encoder` writes an encoder's symmetric head as a stock SparseEncoder dir.")
    if getattr(enc, "colbert", None) is not None:
        out.append("the colbert head ships as colbert/ (a stock Dense module dir): `retrctl index --model DIST` builds its "
                   "multi-vector index; `--format multi-vector-encoder` writes a stock MultiVectorEncoder dir.")
    return out


@stage(export, writes="dir", atomic=False)  # export checks -o first, then builds its own atomic dir
@click.argument("source", metavar="MODEL")
@click.option("--format", "formats", default="st,onnx,onnx-int8", show_default=True,
              help="Comma-separated: st (sentence-transformers dir), onnx (fp32), onnx-int8 (dynamic int8), sparse-encoder "
              "(an encoder's sparse head as stock SparseEncoder), multi-vector-encoder (its colbert head as stock "
              "MultiVectorEncoder); or, "
              "with a sparse index as MODEL, json-vectors (Anserini's JsonVectorCollection).")
@click.option("--dim", type=click.IntRange(min=1), help="Matryoshka: truncate to the first N dims, then renormalise.")
@click.option("--force", is_flag=True, help="With --dim: allow a dim the model was not trained with.")
@click.option("--eval-results", "eval_results", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="`retrctl eval --json` output (repeatable): its rows for runs searched with MODEL go in the card.")
@options("encoder")
def command(source, formats, **opts):
    """Export a model: stock sentence-transformers dir, ONNX fp32 and int8, model card; each parity-checked."""
    names = parse_formats(formats)
    settings = encoder_overrides(opts)
    export(source, formats=names, encoder_settings=settings, **opts)

