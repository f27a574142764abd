// Reading a logits row: greedy argmax (lowest id on ties) and the top-k log-probabilities.
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace lily {

int32_t argmax(std::span<const float> logits);
// The k most likely ids with log_softmax values (computed in double), most likely first,
// ties by lowest id.
std::vector<std::pair<int32_t, double>> top_logprobs(std::span<const float> logits, int k);
// log_softmax(logits)[id], in double.
double logprob_of(std::span<const float> logits, int32_t id);

}  // namespace lily
