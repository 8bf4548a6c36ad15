#include "comm/hierarchical/host_layout.hpp"

#include <algorithm>

#include "comm/hosts.hpp"

namespace concord::hierarchical {

HostLayout HostLayout::of(const std::vector<std::string>& hosts, int rank) {
  HostLayout layout;
  for (int q = 0; q < static_cast<int>(hosts.size()); ++q) {
    const auto known = std::find(layout.host_ids.begin(), layout.host_ids.end(), hosts[q]);
    const int h = static_cast<int>(known - layout.host_ids.begin());
    if (known == layout.host_ids.end()) {
      layout.host_ids.push_back(hosts[q]);
      layout.host_ranks.emplace_back();
    }
    layout.host_ranks[h].push_back(q);
    layout.host_of.push_back(h);
    layout.local_of.push_back(local_rank_of(hosts, q));
  }
  const auto [fewest, most] = std::minmax_element(
      layout.host_ranks.begin(), layout.host_ranks.end(),
      [](const auto& a, const auto& b) { return a.size() < b.size(); });
  layout.shards = static_cast<int>(fewest->size());
  layout.widest = static_cast<int>(most->size());
  layout.rank = rank;
  layout.host = layout.host_of[rank];
  layout.local = layout.local_of[rank];
  return layout;
}

std::vector<int> HostLayout::shard_group(int s) const {
  std::vector<int> group;
  for (const auto& ranks : host_ranks) group.push_back(ranks[s]);
  return group;
}

}  // namespace concord::hierarchical
