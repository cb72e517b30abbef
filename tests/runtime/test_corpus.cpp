// Tests for the runtime's text corpus: the default (Debian's licence texts), files and
// directories, and cut_documents (determinism, lengths, wrapping, errors).
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

#include "ballast/error.hpp"
#include "ballast/runtime/corpus.hpp"

namespace ballast::runtime {
namespace {

namespace fs = std::filesystem;

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

/// A fresh folder in the test temp folder; the process id keeps concurrent runs apart.
fs::path temp_dir(const std::string& name) {
  const fs::path path =
      fs::path(::testing::TempDir()) / ("ballast_corpus_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(path);
  fs::create_directories(path);
  return path;
}

void write_file(const fs::path& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
}

/// The message of the InputError `action` throws, or "" (and a test failure) if none.
std::string input_error_message(const std::function<void()>& action) {
  try {
    action();
  } catch (const InputError& error) {
    return error.what();
  }
  ADD_FAILURE() << "no InputError thrown";
  return "";
}

Corpus small_corpus(const std::string& text) { return Corpus{text, "test"}; }

std::vector<std::int32_t> bytes_of(const std::string& text) {
  std::vector<std::int32_t> bytes;
  for (const char c : text) bytes.push_back(static_cast<unsigned char>(c));
  return bytes;
}

TEST(Corpus, DefaultIsDebiansLicenceTexts) {
  if (!fs::is_directory(kDefaultCorpusDir)) {
    GTEST_SKIP() << kDefaultCorpusDir << " is missing (not a Debian system?)";
  }
  const Corpus corpus = load_corpus("");
  EXPECT_GT(corpus.text.size(), 10'000u);
  EXPECT_CONTAINS(corpus.provenance, kDefaultCorpusDir);
  EXPECT_CONTAINS(corpus.provenance, "base-files");
  if (fs::is_regular_file(fs::path(kDefaultCorpusDir) / "GPL-3")) {
    EXPECT_CONTAINS(corpus.text, "GNU GENERAL PUBLIC LICENSE");
    EXPECT_CONTAINS(corpus.provenance, "GPL-3");
  }
  EXPECT_EQ(load_corpus("default").text, corpus.text);
}

TEST(Corpus, DirectoryIsSortedJoinedAndSkipsDuplicateLinks) {
  const fs::path dir = temp_dir("dir");
  write_file(dir / "b", "second");
  write_file(dir / "a", "first");
  write_file(dir / "c-empty", "");
  fs::create_directory(dir / "sub");  // folders are ignored
  write_file(dir / "sub" / "x", "nested");
  fs::create_symlink(dir / "b", dir / "0-link-to-b");  // same text as b: skipped
  const Corpus corpus = load_corpus(dir.string());
  EXPECT_EQ(corpus.text, "first\n\nsecond");
  EXPECT_CONTAINS(corpus.provenance, "2 files (a, b)");
  fs::remove_all(dir);
}

TEST(Corpus, SingleFile) {
  const fs::path dir = temp_dir("file");
  write_file(dir / "text.txt", "hello\xff");
  const Corpus corpus = load_corpus((dir / "text.txt").string());
  EXPECT_EQ(corpus.text, "hello\xff");
  EXPECT_CONTAINS(corpus.provenance, "text.txt");
  fs::remove_all(dir);
}

TEST(Corpus, MissingPathNamesPathAndFix) {
  const std::string path = "/nonexistent/ballast-corpus-missing.txt";
  const std::string message = input_error_message([&] { load_corpus(path); });
  EXPECT_CONTAINS(message, path);
  EXPECT_CONTAINS(message, "common-licenses");
  EXPECT_CONTAINS(message, "base-files");
}

TEST(Corpus, EmptyFileOrFolderIsAnError) {
  const fs::path dir = temp_dir("empty");
  EXPECT_CONTAINS(input_error_message([&] { load_corpus(dir.string()); }), dir.string());
  write_file(dir / "empty.txt", "");
  EXPECT_CONTAINS(input_error_message([&] { load_corpus((dir / "empty.txt").string()); }),
                  "empty");
  EXPECT_CONTAINS(input_error_message([&] { load_corpus(dir.string()); }), "no readable");
  fs::remove_all(dir);
}

TEST(CutDocuments, DeterministicPerSeed) {
  const Corpus corpus = small_corpus(std::string(
      "The quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs."));
  const std::vector<std::int64_t> lengths = {5, 17, 1, 40};
  const auto first = cut_documents(corpus, lengths, 42);
  EXPECT_EQ(first, cut_documents(corpus, lengths, 42));
  // Seeds pick different offsets: among a handful of seeds, not all give the same text.
  bool any_different = false;
  for (std::uint64_t seed = 1; seed <= 8; ++seed) {
    any_different = any_different || cut_documents(corpus, lengths, seed) != first;
  }
  EXPECT_TRUE(any_different);
}

TEST(CutDocuments, LengthsHonouredAndBytesInRange) {
  const Corpus corpus = small_corpus(std::string("abc\x00\x80\xff", 6) + std::string(100, 'z'));
  const std::vector<std::int64_t> lengths = {1, 2, 3, 50, 1, 1, 200};
  const auto documents = cut_documents(corpus, lengths, 7);
  ASSERT_EQ(documents.size(), lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    EXPECT_EQ(static_cast<std::int64_t>(documents[i].size()), lengths[i]) << "document " << i;
    for (const std::int32_t token : documents[i]) {
      EXPECT_GE(token, 0);
      EXPECT_LE(token, 255);
    }
  }
  EXPECT_TRUE(cut_documents(corpus, {}, 7).empty());
}

TEST(CutDocuments, ConsecutiveStretchesOfTheCorpus) {
  const std::string text = "0123456789abcdefghij";
  const Corpus corpus = small_corpus(text);
  const std::vector<std::int64_t> lengths = {3, 1, 1, 4};
  const auto documents = cut_documents(corpus, lengths, 99);
  // Concatenated, the documents read the corpus as a ring from some offset.
  std::vector<std::int32_t> joined;
  for (const auto& document : documents) joined.insert(joined.end(), document.begin(), document.end());
  const std::vector<std::int32_t> ring = bytes_of(text + text);
  bool found = false;
  for (std::size_t offset = 0; offset < text.size() && !found; ++offset) {
    found = std::equal(joined.begin(), joined.end(), ring.begin() + static_cast<std::ptrdiff_t>(offset));
  }
  EXPECT_TRUE(found);
}

TEST(CutDocuments, OneTokenDocuments) {
  const Corpus corpus = small_corpus("xy");
  const std::vector<std::int64_t> lengths(9, 1);
  const auto documents = cut_documents(corpus, lengths, 3);
  ASSERT_EQ(documents.size(), 9u);
  for (std::size_t i = 0; i < documents.size(); ++i) {
    ASSERT_EQ(documents[i].size(), 1u);
    if (i > 0) {
      EXPECT_NE(documents[i][0], documents[i - 1][0]) << "alternates x, y";
    }
  }
}

TEST(CutDocuments, LongerThanCorpusWraps) {
  const Corpus corpus = small_corpus("abc");
  const std::vector<std::int64_t> lengths = {10, 4};
  const auto documents = cut_documents(corpus, lengths, 11);
  ASSERT_EQ(documents[0].size(), 10u);
  for (std::size_t t = 3; t < documents[0].size(); ++t) {
    EXPECT_EQ(documents[0][t], documents[0][t - 3]) << "period of the corpus";
  }
  // The next document continues where the first ended.
  EXPECT_EQ(documents[1][0], documents[0][1]);
}

TEST(CutDocuments, BadLengthsAndEmptyCorpus) {
  const Corpus corpus = small_corpus("abc");
  const std::vector<std::int64_t> zero = {4, 0};
  EXPECT_CONTAINS(input_error_message([&] { cut_documents(corpus, zero, 1); }), "document 1");
  const std::vector<std::int64_t> negative = {-3};
  EXPECT_CONTAINS(input_error_message([&] { cut_documents(corpus, negative, 1); }), "-3");
  const std::vector<std::int64_t> one = {1};
  EXPECT_CONTAINS(input_error_message([&] { cut_documents(Corpus{}, one, 1); }), "empty corpus");
}

}  // namespace
}  // namespace ballast::runtime
