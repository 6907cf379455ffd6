"""A model small enough to carry to a GPU machine (bench/gpu_check.sh): the bundled SmolLM2-135M GGUF with only
its first N transformer blocks, everything else as it is (tokenizer, chat template, embeddings). Its answers
are poorer, its serving (batching, slots, streaming, cancel) is the model's own: what the GPU check measures.

Written with gguf-py from the llama.cpp source the local build uses (the GGUF is 92 MiB; with 8 of its 30
blocks it is about 36 MiB). Usage: python bench/gpu_model.py GGUF_PY_DIR IN.gguf OUT.gguf [--blocks 8]
"""

from __future__ import annotations

import argparse
import re
import sys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("gguf_py", help="llama.cpp's gguf-py folder")
    parser.add_argument("source")
    parser.add_argument("target")
    parser.add_argument("--blocks", type=int, default=8)
    args = parser.parse_args()
    sys.path.insert(0, args.gguf_py)
    import gguf  # llama.cpp's own reader and writer

    reader = gguf.GGUFReader(args.source)
    arch = str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    count_key = gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch)
    writer = gguf.GGUFWriter(args.target, arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by the writer itself
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = args.blocks if field.name == count_key else field.contents()
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    block = re.compile(r"^blk\.(\d+)\.")
    kept = [t for t in reader.tensors if not (m := block.match(t.name)) or int(m.group(1)) < args.blocks]
    for tensor in kept:
        writer.add_tensor_info(
            tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes, tensor.tensor_type
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in kept:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    writer.close()
    print(f"{args.target}: {len(kept)} of {len(reader.tensors)} tensors, {args.blocks} blocks")


if __name__ == "__main__":
    main()
