"""Tables Python keeps beside the Rust core's, held equal to it: the dtype and reduce-op codes the
backend passes to wirespeed._native (native/tensors.py, from dtype.rs) and the largest all_reduce
the planner gives recursive doubling and the smallest chunk its all_gather and reduce_scatter
run on the ring (explain/costs.py, from plan.rs), which the predictor models
without loading the native build."""
import re
from pathlib import Path

import torch
import torch.distributed as dist

from wirespeed.explain.costs import WIRESPEED_DOUBLING_MAX, WIRESPEED_GATHER_RING_MIN
from wirespeed.native.tensors import OP_CODES, REDUCE_DTYPES

SRC = Path(__file__).resolve().parents[2] / "crates" / "wirespeed-core" / "src"
RUST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
               "I8": torch.int8, "U8": torch.uint8, "I16": torch.int16, "U16": torch.uint16, "I32": torch.int32,
               "U32": torch.uint32, "I64": torch.int64, "U64": torch.uint64, "Bool": torch.bool}
_RED = dist.ReduceOp.RedOpType
RUST_OPS = {"Sum": _RED.SUM, "Prod": _RED.PRODUCT, "Min": _RED.MIN, "Max": _RED.MAX, "Avg": _RED.AVG,
            "BAnd": _RED.BAND, "BOr": _RED.BOR, "BXor": _RED.BXOR}


def test_dtype_and_op_codes_are_the_cores():
    text = (SRC / "dtype.rs").read_text()

    def variants(enum):   # coded_enum!'s lines: `Name = code => "name",`
        block = text.split(f"pub enum {enum} (", 1)[1].split("\n    }\n", 1)[0]
        return re.findall(r"(\w+) = (\d+) =>", block)
    dtypes = {RUST_DTYPES[name]: int(code) for name, code in variants("DType")}
    ops = {RUST_OPS[name]: int(code) for name, code in variants("ReduceOp")}
    assert len(dtypes) == 13 and len(ops) == 8
    assert REDUCE_DTYPES == dtypes
    assert OP_CODES == ops


def test_the_predictors_doubling_limit_is_the_planners():
    m = re.search(r"const DOUBLING_MAX: usize = (\d+) << (\d+);", (SRC / "plan.rs").read_text())
    assert m, "plan.rs no longer states DOUBLING_MAX as a shift: update this test"
    assert WIRESPEED_DOUBLING_MAX == int(m.group(1)) << int(m.group(2))


def test_the_predictors_gather_ring_threshold_is_the_planners():
    m = re.search(r"const GATHER_RING_MIN: usize = (\d+) << (\d+);", (SRC / "plan.rs").read_text())
    assert m, "plan.rs no longer states GATHER_RING_MIN as a shift: update this test"
    assert WIRESPEED_GATHER_RING_MIN == int(m.group(1)) << int(m.group(2))
