// load_corpus and cut_documents: byte-level documents from real text.
#include "ballast/runtime/corpus.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <system_error>

#include "ballast/error.hpp"
#include "ballast/text.hpp"
#include "ballast/workload.hpp"

namespace ballast::runtime {
namespace {

namespace fs = std::filesystem;

const char* const kFix =
    "pass a readable text file or a directory of text files, or \"\" for the default "
    "corpus (/usr/share/common-licenses, installed with Debian's base-files package)";

/// The whole file, or false if it cannot be opened or read.
bool read_file(const fs::path& path, std::string& contents) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return false;
  contents = std::move(buffer).str();
  return true;
}

fs::path canonical_or_self(const fs::path& path) {
  std::error_code error;
  fs::path resolved = fs::canonical(path, error);
  return error ? path : resolved;
}

Corpus load_directory(const fs::path& directory, const std::string& shown) {
  std::error_code error;
  fs::directory_iterator entries(directory, error);
  if (error) {
    throw InputError("corpus: cannot list '" + shown + "': " + error.message() + "; " + kFix);
  }
  // Regular files first; links only when they add a file not already there.
  std::vector<fs::path> files;
  std::vector<fs::path> links;
  for (const fs::directory_entry& entry : entries) {
    std::error_code status_error;
    if (!entry.is_regular_file(status_error)) continue;  // follows links; skips folders
    (entry.is_symlink(status_error) ? links : files).push_back(entry.path());
  }
  std::set<fs::path> taken;
  for (const fs::path& file : files) taken.insert(canonical_or_self(file));
  for (const fs::path& link : links) {
    if (taken.insert(canonical_or_self(link)).second) files.push_back(link);
  }
  std::sort(files.begin(), files.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename() < b.filename(); });

  Corpus corpus;
  std::string names;
  int count = 0;
  for (const fs::path& file : files) {
    std::string contents;
    if (!read_file(file, contents) || contents.empty()) continue;
    if (count > 0) {
      corpus.text += "\n\n";
      names += ", ";
    }
    corpus.text += contents;
    names += file.filename().string();
    ++count;
  }
  if (count == 0) {
    throw InputError("corpus: no readable, non-empty file in '" + shown + "'; " + kFix);
  }
  corpus.provenance = shown + ": " + std::to_string(count) + " files (" + names + "), " +
                      with_thousands(static_cast<std::int64_t>(corpus.text.size())) + " bytes";
  return corpus;
}

}  // namespace

Corpus load_corpus(const std::string& path_or_default) {
  const bool is_default = path_or_default.empty() || path_or_default == "default";
  const std::string shown = is_default ? std::string(kDefaultCorpusDir) : path_or_default;
  const fs::path path(shown);
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (error || !fs::exists(status)) {
    throw InputError("corpus: cannot read '" + shown + "': " +
                     (error ? error.message() : std::string("no such file or directory")) +
                     "; " + kFix);
  }
  if (fs::is_directory(status)) {
    Corpus corpus = load_directory(path, shown);
    if (is_default) corpus.provenance += " (verbatim licence texts from Debian's base-files)";
    return corpus;
  }
  Corpus corpus;
  if (!read_file(path, corpus.text)) {
    throw InputError("corpus: cannot read '" + shown + "'; " + kFix);
  }
  if (corpus.text.empty()) throw InputError("corpus: '" + shown + "' is empty; " + kFix);
  corpus.provenance = shown + ": " +
                      with_thousands(static_cast<std::int64_t>(corpus.text.size())) + " bytes";
  return corpus;
}

std::vector<std::vector<std::int32_t>> cut_documents(const Corpus& corpus,
                                                     std::span<const std::int64_t> lengths,
                                                     std::uint64_t seed) {
  if (corpus.text.empty()) {
    throw InputError("corpus: cannot cut documents from an empty corpus (" +
                     (corpus.provenance.empty() ? std::string("no provenance")
                                                : corpus.provenance) +
                     "); load one with load_corpus");
  }
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 1) {
      throw InputError("corpus: document " + std::to_string(i) + " has length " +
                       std::to_string(lengths[i]) + "; every document needs at least 1 token");
    }
  }
  const std::size_t size = corpus.text.size();
  std::uint64_t state = seed;
  std::size_t position = static_cast<std::size_t>(uniform_below(state, size));
  std::vector<std::vector<std::int32_t>> documents;
  documents.reserve(lengths.size());
  for (const std::int64_t length : lengths) {
    std::vector<std::int32_t> document;
    document.reserve(static_cast<std::size_t>(length));
    for (std::int64_t t = 0; t < length; ++t) {
      document.push_back(static_cast<std::int32_t>(static_cast<unsigned char>(corpus.text[position])));
      if (++position == size) position = 0;
    }
    documents.push_back(std::move(document));
  }
  return documents;
}

}  // namespace ballast::runtime
