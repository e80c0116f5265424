"""Per-kernel opt-in to 512-bit vectors on CPUs that have them.

LLVM tunes every Intel server target with AVX-512 with
``prefer-256-bit``: its loop vectoriser then fills 256-bit registers, and numba, which compiles
for the host CPU, inherits that (the tree's all-leaves kernel had no zmm instruction at all).
The preference protects code that mixes a few wide instructions into scalar work from the
clock drop that 512-bit execution once cost; a kernel that is one long vector loop pays for it
instead. LLVM lets a function override the preference with its ``prefer-vector-width``
attribute, which :func:`prefer_512_bit_vectors` sets on the function it is called in.

Only for kernels whose values do not depend on the vector width: with no re-association
allowed (``fastmath`` limited to ``contract``, tailkit.native.fastmath.EXACT_ENOUGH), every lane
performs the same operations in the same order at any width, so the choice moves time, never
bits. A kernel that lets LLVM re-associate a sum would sum in another order and must not call
it, and neither may a kernel into which such a helper is inlined (numba's ``inline="always"``
or LLVM's own inlining): the inlined code is vectorised at the caller's width. On a CPU
without AVX-512 the attribute asks for registers the target does not have and
LLVM keeps its widest, so the same code compiles everywhere.
"""

from __future__ import annotations

from numba.core import types
from numba.extending import intrinsic

#: The function attribute, as LLVM IR writes it (a key="value" string attribute).
PREFER_512 = '"prefer-vector-width"="512"'


@intrinsic
def prefer_512_bit_vectors(typingctx):
    """Mark the function being compiled to vectorise with 512-bit registers where it can.

    Call it inside the loop body of a ``parallel=True`` kernel: numba outlines a ``prange``
    body into a function of its own, and that function is the one marked. No code is emitted.
    """

    def codegen(context, builder, signature, args):
        # llvmlite's FunctionAttributes accepts only the names of LLVM's keyword attributes;
        # a string attribute goes into the underlying set, which llvmlite prints verbatim
        set.add(builder.function.attributes, PREFER_512)
        return context.get_dummy_value()

    return types.void(), codegen
