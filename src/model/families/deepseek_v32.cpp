// DeepseekV32ForCausalLM (DeepSeek-V3.2): GLM-5's sparse attention without shared layers — every
// layer runs its own lightning indexer, whose RoPE is the half-split (NeoX) layout while the MLA
// attention itself rotates interleaved pairs.
#include "model/families/family.hpp"

namespace exl3::model::families {

void describe_deepseek_v32(Family& f) {
  describe_dsa(f, /*indexer_rope_interleave=*/false, /*shared_layers=*/false);
}

}  // namespace exl3::model::families
