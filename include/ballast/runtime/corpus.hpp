// Real text for the runtime: byte-level tokens (0..255) cut from a corpus. The default
// corpus is the licence texts every Debian system ships in /usr/share/common-licenses
// (package base-files); data/README.md has the provenance.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ballast::runtime {

/// Where the default corpus lives: verbatim licence texts from Debian's base-files.
inline constexpr const char* kDefaultCorpusDir = "/usr/share/common-licenses";

struct Corpus {
  std::string text;        ///< the raw bytes
  std::string provenance;  ///< where they came from, for logs and reports
};

/// Loads a corpus. path_or_default:
/// - "" (or "default"): every readable file of kDefaultCorpusDir;
/// - a directory: every readable regular file in it;
/// - a file: its bytes.
/// A directory's files are sorted by name and joined with "\n\n"; a symbolic link to a
/// file already taken from the same directory (GPL -> GPL-3) is skipped, so no text
/// appears twice. Throws InputError naming the path and the fix when nothing readable and
/// non-empty is found.
Corpus load_corpus(const std::string& path_or_default);

/// One document per requested length, in order: document i has lengths[i] tokens, each a
/// byte of the corpus (0..255 as int32). The documents are consecutive stretches of the
/// corpus read as a ring: the first starts at an offset drawn from `seed` (splitmix64,
/// identical on every platform), each next one where the previous ended, wrapping around
/// the corpus end (a document longer than the corpus repeats it). Deterministic: the same
/// corpus, lengths and seed give the same documents. Throws InputError for a length < 1 or
/// an empty corpus.
std::vector<std::vector<std::int32_t>> cut_documents(const Corpus& corpus,
                                                     std::span<const std::int64_t> lengths,
                                                     std::uint64_t seed);

}  // namespace ballast::runtime
