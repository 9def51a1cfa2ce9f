// Embeddings::load: GloVe text, word2vec text and word2vec binary. The file is memory-mapped;
// a first pass counts rows so the [V, E] matrix is allocated once, and pages already parsed are
// released so the resident set stays near the size of the matrix, not matrix plus file.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "io/mapped_file.h"
#include "qkv/attention_options.h"
#include "qkv/embeddings.h"
#include "qkv/error.h"
#include "qkv/interrupt.h"

namespace qkv {
namespace {

// Appended when the first row already fails: the file is probably not word vectors at all.
constexpr const char* kNotEmbeddings =
    " (this is not a GloVe or word2vec file: each line must be a word followed by its numbers)";

using detail::MappedFile;
using detail::quoted;

constexpr std::size_t kBlockBytes = std::size_t{32} << 20;

// Between blocks: a stop request (Ctrl-C in Python, qkv/interrupt.h) ends the load, which takes
// seconds for a large file (GloVe's 840B words: about 28 s).
void stop_if_asked() {
  if (stop_requested(InterruptScope::current())) throw Interrupted();
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r'; }

struct Line {
  std::string_view text;  // without the '\n' and a trailing '\r'
  std::size_t end = 0;    // offset just past the '\n' (or the end of the file)
  bool too_long = false;  // no '\n' within kMaxEmbeddingLineBytes: text holds only that many bytes
};

// Looks at most kMaxEmbeddingLineBytes + 1 bytes ahead, so a file without newlines (binary data,
// or a sparse file of zeros) costs one bounded scan, not a pass over the whole file.
Line line_at(std::string_view file, std::size_t pos) {
  const std::size_t window = std::min(file.size() - pos, kMaxEmbeddingLineBytes + 1);
  const void* nl = std::memchr(file.data() + pos, '\n', window);
  if (nl == nullptr && window > kMaxEmbeddingLineBytes)
    return {file.substr(pos, kMaxEmbeddingLineBytes), pos + kMaxEmbeddingLineBytes, true};
  std::size_t stop = nl ? static_cast<std::size_t>(static_cast<const char*>(nl) - file.data()) : file.size();
  std::string_view text = file.substr(pos, stop - pos);
  if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
  return {text, nl ? stop + 1 : stop};
}

// line_at for the parsers: a line longer than the limit is an error naming the file and line.
Line text_line(const MappedFile& file, std::size_t pos, int64_t line_no) {
  Line line = line_at(file.bytes(), pos);
  if (line.too_long)
    throw Error(
        fmt::format("{}: line {} has no newline within {} bytes (1 MiB, the longest text line qkv reads); "
                    "is this a text embeddings file?",
                    file.path(), line_no, kMaxEmbeddingLineBytes));
  return line;
}

bool is_blank(std::string_view line) { return std::all_of(line.begin(), line.end(), is_space); }

std::vector<std::string_view> split(std::string_view line) {
  std::vector<std::string_view> tokens;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && is_space(line[i])) ++i;
    std::size_t start = i;
    while (i < line.size() && !is_space(line[i])) ++i;
    if (i > start) tokens.push_back(line.substr(start, i - start));
  }
  return tokens;
}

enum class NumberStatus { ok, not_a_number, out_of_range };

// from_chars, plus a leading '+' and underflow to zero or a subnormal, which it reports as an error.
NumberStatus parse_float(std::string_view token, float* out) {
  if (token.size() > 1 && token[0] == '+' && token[1] != '-' && token[1] != '+') token.remove_prefix(1);
  auto [ptr, ec] = std::from_chars(token.data(), token.data() + token.size(), *out);
  if (ptr != token.data() + token.size() || ec == std::errc::invalid_argument) return NumberStatus::not_a_number;
  if (ec == std::errc::result_out_of_range) {  // rare: the copy for strtod costs nothing overall
    const double v = std::strtod(std::string(token).c_str(), nullptr);
    if (std::fabs(v) > std::numeric_limits<float>::max()) return NumberStatus::out_of_range;
    *out = static_cast<float>(v);
  }
  return NumberStatus::ok;
}

bool is_number(std::string_view token) {
  float v;
  return parse_float(token, &v) != NumberStatus::not_a_number;
}

// GloVe's large files hold a few words with spaces in them (". . ."); extra leading tokens that
// are not numbers belong to the word. Returns how many tokens form the word.
std::size_t word_token_count(const std::vector<std::string_view>& tokens) {
  std::size_t k = 1;
  while (k < tokens.size() && !is_number(tokens[k])) ++k;
  return k;
}

// The careful path for a row the fast path did not accept: finds the fault and names it, or
// handles a word with spaces or a leading '+'. Returns an empty string or the fault.
std::string parse_text_row_slowly(std::string_view line, int64_t dim, float* out, std::string* word) {
  std::vector<std::string_view> tokens = split(line);
  std::size_t n = tokens.size();
  std::size_t word_tokens = 1;
  if (n - 1 > static_cast<std::size_t>(dim)) {
    word_tokens = n - static_cast<std::size_t>(dim);
    for (std::size_t k = 1; k < word_tokens; ++k)
      if (is_number(tokens[k])) return fmt::format("expected {} values, found {}", dim, n - 1);
  } else if (n - 1 < static_cast<std::size_t>(dim)) {
    return fmt::format("expected {} values, found {}", dim, n - 1);
  }
  const char* word_end = tokens[word_tokens - 1].data() + tokens[word_tokens - 1].size();
  word->assign(tokens[0].data(), static_cast<std::size_t>(word_end - tokens[0].data()));
  for (int64_t j = 0; j < dim; ++j) {
    std::string_view token = tokens[word_tokens + static_cast<std::size_t>(j)];
    switch (parse_float(token, &out[j])) {
      case NumberStatus::not_a_number:
        return fmt::format("value {} of {} ({}) is not a number", j + 1, quoted(*word), quoted(token));
      case NumberStatus::out_of_range:
        return fmt::format("value {} of {} ({}) is out of the float32 range", j + 1, quoted(*word), quoted(token));
      case NumberStatus::ok:
        break;
    }
    if (!std::isfinite(out[j]))
      return fmt::format("value {} of {} is {}; embeddings must be finite", j + 1, quoted(*word), quoted(token));
  }
  return {};
}

// Parses one text row into `word` and out[0, dim) in a single pass, letting from_chars find
// each token's end. Anything unusual goes to the careful path. Returns an empty string or the fault.
std::string parse_text_row(std::string_view line, int64_t dim, float* out, std::string* word) {
  const char* p = line.data();
  const char* end = p + line.size();
  while (p < end && is_space(*p)) ++p;
  const char* word_start = p;
  while (p < end && !is_space(*p)) ++p;
  const char* word_end = p;
  for (int64_t j = 0; j < dim; ++j) {
    while (p < end && is_space(*p)) ++p;
    auto [next, ec] = std::from_chars(p, end, out[j]);
    if (ec != std::errc() || next == p || (next < end && !is_space(*next)) || !std::isfinite(out[j]))
      return parse_text_row_slowly(line, dim, out, word);
    p = next;
  }
  while (p < end && is_space(*p)) ++p;
  if (p != end) return parse_text_row_slowly(line, dim, out, word);
  word->assign(word_start, static_cast<std::size_t>(word_end - word_start));
  return {};
}

struct Loaded {
  std::vector<std::string> words;
  Tensor<float> matrix;
};

// What the vocabulary takes for `rows` words of `dim` floats, the words' own characters aside:
// the matrix, a std::string per word, and the word's entry in each of Embeddings' two lookup
// tables (a hash node of about 64 bytes with the allocator's header, and a bucket). Short words
// make the tables most of it: 4 million one-float rows took 624 MB.
unsigned __int128 matrix_and_words_bytes(int64_t rows, int64_t dim) {
  constexpr std::size_t kLookupBytesPerWord = 2 * (64 + sizeof(void*));
  return static_cast<unsigned __int128>(rows) *
         (static_cast<unsigned __int128>(dim) * sizeof(float) + sizeof(std::string) + kLookupBytesPerWord);
}

// Refuses a row count and width the file cannot hold before the matrix is allocated: a text row
// of `dim` values takes at least 2 * dim + 1 bytes.
void check_text_capacity(const MappedFile& file, int64_t rows, int64_t dim) {
  unsigned __int128 need = static_cast<unsigned __int128>(rows) * (2 * static_cast<unsigned __int128>(dim) + 1);
  if (need > file.size() + 1)
    throw Error(fmt::format("{}: {} rows of {} values need at least {} bytes of text, but the file holds {}",
                            file.path(), rows, dim,
                            static_cast<uint64_t>(std::min<unsigned __int128>(need, UINT64_MAX)), file.size()));
}

// Text rows from `start` (on line `first_line`, counted from 1). declared_rows < 0: GloVe, the
// width comes from the first row; otherwise word2vec text, whose header gave rows and width.
Loaded parse_text(const MappedFile& file, std::size_t start, int64_t first_line, int64_t declared_rows, int64_t dim) {
  const std::string_view bytes = file.bytes();
  const std::string& path = file.path();
  file.advise_sequential();
  int64_t rows = 0, first_row_line = 0;
  std::string_view first_row;
  for (std::size_t pos = start, released = start, line_no = first_line; pos < bytes.size(); ++line_no) {
    Line line = text_line(file, pos, static_cast<int64_t>(line_no));
    if (!is_blank(line.text)) {
      if (rows++ == 0) {
        first_row = line.text;
        first_row_line = static_cast<int64_t>(line_no);
      }
    }
    pos = line.end;
    if (pos - released >= kBlockBytes) {
      file.release(released, pos);
      released = pos;
      stop_if_asked();
    }
  }
  if (rows == 0) throw Error(fmt::format("{}: the vocabulary is empty (no rows of vectors)", path));
  if (declared_rows >= 0 && declared_rows != rows)
    throw Error(
        fmt::format("{}: the header declares {} words but the file has {} rows of vectors", path, declared_rows, rows));
  if (dim < 0) {
    std::vector<std::string_view> tokens = split(first_row);
    dim = static_cast<int64_t>(tokens.size() - word_token_count(tokens));
    if (dim == 0)
      throw Error(fmt::format("{}: line {}: no vector values after the word{}", path, first_row_line, kNotEmbeddings));
  }
  check_text_capacity(file, rows, dim);
  detail::check_fits_in_memory(matrix_and_words_bytes(rows, dim), path);

  Loaded out{std::vector<std::string>(static_cast<std::size_t>(rows)), Tensor<float>({rows, dim}, path)};
  struct Pending {
    std::string_view text;
    int64_t line_no;
  };
  std::vector<Pending> block;
  int64_t row = 0;
  std::size_t pos = start;
  int64_t line_no = first_line;
  while (pos < bytes.size()) {
    // Gather up to a block of rows, then parse them on all threads.
    stop_if_asked();
    std::size_t block_start = pos;
    block.clear();
    while (pos < bytes.size() && pos - block_start < kBlockBytes) {
      Line line = text_line(file, pos, line_no);
      if (!is_blank(line.text)) block.push_back({line.text, line_no});
      pos = line.end;
      ++line_no;
    }
    int64_t bad_line = std::numeric_limits<int64_t>::max();
    std::string bad_message;
    const int64_t count = static_cast<int64_t>(block.size());
    // The threads as every kernel resolves them: OMP_NUM_THREADS=100000 crashed OpenMP here.
    const int threads = resolve_num_threads(0, (count + 511) / 512);
#pragma omp parallel for schedule(dynamic, 512) if (count > 2048) num_threads(threads)
    for (int64_t i = 0; i < count; ++i) {
      std::size_t r = static_cast<std::size_t>(row + i);
      std::string fault = parse_text_row(block[i].text, dim, out.matrix.data() + r * dim, &out.words[r]);
      if (!fault.empty()) {
#pragma omp critical(qkv_embeddings_fault)
        if (block[i].line_no < bad_line) {
          bad_line = block[i].line_no;
          bad_message = std::move(fault);
        }
      }
    }
    if (!bad_message.empty())  // a fault in the first row: most likely not an embeddings file at all
      throw Error(fmt::format("{}: line {}: {}{}", path, bad_line, bad_message,
                              bad_line == first_row_line ? kNotEmbeddings : ""));
    row += count;
    file.release(block_start, pos);
  }
  return out;
}

// word2vec binary: per word, "word " then dim little-endian float32, then an optional '\n'.
Loaded parse_binary(const MappedFile& file, std::size_t start, int64_t rows, int64_t dim) {
  const std::string_view bytes = file.bytes();
  const std::string& path = file.path();
  const std::size_t vector_bytes = static_cast<std::size_t>(dim) * sizeof(float);
  // Each entry holds at least a one-byte word, a space and its vector.
  unsigned __int128 need = static_cast<unsigned __int128>(rows) * (static_cast<unsigned __int128>(dim) * 4 + 2);
  if (need > bytes.size() - start)
    throw Error(fmt::format(
        "{}: the header declares {} words of {} floats (at least {} bytes) but the file holds {} "
        "bytes after it",
        path, rows, dim, static_cast<uint64_t>(std::min<unsigned __int128>(need, UINT64_MAX)), bytes.size() - start));
  detail::check_fits_in_memory(matrix_and_words_bytes(rows, dim), path);
  file.advise_sequential();
  Loaded out{std::vector<std::string>(static_cast<std::size_t>(rows)), Tensor<float>({rows, dim}, path)};
  std::size_t pos = start, released = start;
  for (int64_t r = 0; r < rows; ++r) {
    while (pos < bytes.size() && (bytes[pos] == '\n' || bytes[pos] == '\r')) ++pos;
    const std::size_t word_start = pos;
    const std::size_t word_limit = std::min(bytes.size(), word_start + kMaxEmbeddingLineBytes + 1);
    while (pos < word_limit && bytes[pos] != ' ' && bytes[pos] != '\n') ++pos;
    std::string_view word = bytes.substr(word_start, pos - word_start);
    auto where = [&] {
      return fmt::format("{}: word {} of {} ({}, byte {})", path, r + 1, rows, quoted(word), word_start);
    };
    if (pos == word_limit && pos < bytes.size())
      throw Error(fmt::format("{}: no space within {} bytes (1 MiB) to end the word (is this really word2vec binary?)",
                              where(), kMaxEmbeddingLineBytes));
    if (pos >= bytes.size())
      throw Error(fmt::format("{}: truncated word2vec binary file: it ends inside the word", where()));
    if (bytes[pos] == '\n' || word.empty())
      throw Error(fmt::format("{}: expected a word followed by a space (is this really word2vec binary?)", where()));
    ++pos;
    if (bytes.size() - pos < vector_bytes)
      throw Error(fmt::format("{}: truncated word2vec binary file: the vector needs {} bytes but {} remain", where(),
                              vector_bytes, bytes.size() - pos));
    float* dst = out.matrix.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(dim);
    std::memcpy(dst, bytes.data() + pos, vector_bytes);
    for (int64_t j = 0; j < dim; ++j)
      if (!std::isfinite(dst[j]))
        throw Error(fmt::format("{}: value {} is {}; embeddings must be finite", where(), j + 1, dst[j]));
    out.words[static_cast<std::size_t>(r)] = word;
    pos += vector_bytes;
    if (pos - released >= kBlockBytes) {
      file.release(released, pos);
      released = pos;
      stop_if_asked();
    }
  }
  while (pos < bytes.size() && std::isspace(static_cast<unsigned char>(bytes[pos]))) ++pos;
  if (pos < bytes.size())
    throw Error(
        fmt::format("{}: {} bytes of data follow the {} words the header declares", path, bytes.size() - pos, rows));
  return out;
}

bool parse_count(std::string_view token, int64_t* out) {
  if (token.empty() || !std::all_of(token.begin(), token.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return false;
  // A count too large for int64 is still a header, read as int64's max (load refuses it).
  auto [ptr, ec] = std::from_chars(token.data(), token.data() + token.size(), *out);
  if (ec == std::errc::result_out_of_range) *out = std::numeric_limits<int64_t>::max();
  return ptr == token.data() + token.size();
}

// Whether a word2vec binary row could start at `values` (just past "word "): 4·dim bytes of
// vector, an optional '\n', then the next word and its space, or the end of the file when the
// vocabulary is one word.
bool binary_row_fits(std::string_view bytes, std::size_t values, int64_t rows, int64_t dim) {
  if (values > bytes.size() || static_cast<uint64_t>(dim) > (bytes.size() - values) / 4) return false;
  std::size_t pos = values + 4 * static_cast<std::size_t>(dim);
  if (pos < bytes.size() && bytes[pos] == '\n') ++pos;
  if (pos == bytes.size()) return rows == 1;
  const std::string_view next = bytes.substr(pos, std::min<std::size_t>(bytes.size() - pos, kMaxEmbeddingLineBytes));
  const std::size_t space = next.find(' ');
  return space != std::string_view::npos && space > 0 && next.substr(0, space).find('\n') == std::string_view::npos;
}

// After a word2vec header: text if the first row's values are printable ASCII, binary otherwise.
// Raw float32 bytes are rarely printable for long, but a '\n' byte early in the first vector ends
// the "row" after a few bytes that may all be printable (about 1 file in 400 with 5 dimensions);
// so a printable row that does not end in `dim` numbers is taken as text if it spans the whole
// vector, or if a binary row would not fit there. Only the first kMaxEmbeddingLineBytes of the row are looked at (a
// binary row may hold no '\n').
bool looks_like_text_vectors(std::string_view bytes, std::size_t pos, int64_t rows, int64_t dim) {
  // Blank lines first: text may have them, and some binary writers put the '\n' before each word
  // (gensim's test_load_word2vec_format_space_stripping), which both parsers skip.
  while (pos < bytes.size() && (bytes[pos] == '\n' || bytes[pos] == '\r')) ++pos;
  Line line = line_at(bytes, pos);
  auto printable = [](char c) { return (c >= 0x20 && c < 0x7f) || c == '\t' || c == '\r'; };
  std::size_t space = line.text.find_first_of(" \t");
  if (space == std::string_view::npos) {
    // A row without values is reported as text; control bytes (a sparse file's zeros) mean binary.
    return std::none_of(line.text.begin(), line.text.end(),
                        [](char c) { return static_cast<unsigned char>(c) < 0x20 && c != '\r'; });
  }
  std::string_view values = line.text.substr(space + 1);
  if (is_blank(values) || !std::all_of(values.begin(), values.end(), printable)) return false;
  const std::vector<std::string_view> tokens = split(values);
  int64_t numbers = 0;
  while (numbers < static_cast<int64_t>(tokens.size()) && is_number(tokens[tokens.size() - 1 - numbers])) ++numbers;
  if (numbers == dim) return true;
  // Printable across the whole would-be vector (4·dim bytes, the last may be the '\n', or as far
  // as line_at looked): text whose values do not parse ("0,1", "1.5abc"), reported as such. Such
  // a row read as binary gave values like 1.5e-19 without an error; a binary vector is all
  // printable about once in 0.37^(4·dim).
  if (line.too_long || (values.size() + 1) / 4 >= static_cast<uint64_t>(dim)) return true;
  return !binary_row_fits(bytes, pos + space + 1, rows, dim);
}

}  // namespace

Embeddings Embeddings::load(const std::string& path, EmbeddingFormat format, InvalidUtf8 invalid) {
  MappedFile file(path);
  const std::string_view bytes = file.bytes();
  if (bytes.empty()) throw Error(fmt::format("{}: the file is empty", path));
  // A UTF-8 byte-order mark (Windows editors write one) is not part of the first word or header.
  const std::size_t start = bytes.substr(0, 3) == "\xEF\xBB\xBF" ? 3 : 0;
  if (start == bytes.size()) throw Error(fmt::format("{}: the file holds only a UTF-8 byte-order mark", path));
  Line first = text_line(file, start, 1);
  std::vector<std::string_view> head = split(first.text);
  int64_t rows = -1, dim = -1;
  bool has_header = head.size() == 2 && parse_count(head[0], &rows) && parse_count(head[1], &dim);
  if (format == EmbeddingFormat::automatic) {
    if (!has_header)
      format = EmbeddingFormat::glove;
    else
      format = looks_like_text_vectors(bytes, first.end, rows, dim) ? EmbeddingFormat::word2vec_text
                                                                    : EmbeddingFormat::word2vec_binary;
  }
  if (format != EmbeddingFormat::glove) {
    if (!has_header)
      throw Error(fmt::format("{}: line 1: expected a word2vec header \"<words> <dimensions>\", found {}", path,
                              quoted(first.text)));
    constexpr int64_t kTooLarge = std::numeric_limits<int64_t>::max();
    if (rows == kTooLarge || dim == kTooLarge)
      throw Error(fmt::format("{}: line 1: the header declares {} words of {} dimensions, more than any file holds",
                              path, head[0], head[1]));
    if (rows == 0) throw Error(fmt::format("{}: line 1: the header declares an empty vocabulary (0 words)", path));
    if (dim == 0) throw Error(fmt::format("{}: line 1: the header declares vectors of 0 dimensions", path));
  }
  Loaded loaded = format == EmbeddingFormat::glove           ? parse_text(file, start, 1, -1, -1)
                  : format == EmbeddingFormat::word2vec_text ? parse_text(file, first.end, 2, rows, dim)
                                                             : parse_binary(file, first.end, rows, dim);
  if (invalid != InvalidUtf8::keep)
    for (std::string& w : loaded.words)
      if (invalid_utf8_at(w) != std::string_view::npos) w = repair_utf8(w, invalid);
  return Embeddings(std::move(loaded.words), std::move(loaded.matrix));
}

}  // namespace qkv
