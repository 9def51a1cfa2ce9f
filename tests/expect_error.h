// expect_error(fn, text): fn must throw qkv::Error whose message contains `text` (the tests of the
// cache, decode and RoPE refusals).
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "qkv/error.h"

namespace qkv::test {

template <class Fn>
void expect_error(const Fn& fn, const std::string& text) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected: " << text;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

}  // namespace qkv::test
