// The explorer page of `qkv serve`: serve/page.html, page.css and page.js, compiled into the
// binary (serve/embed_assets.cmake) so the page works offline and needs no files beside qkv.
#pragma once

#include <string_view>

namespace qkv::cli {

std::string_view serve_page_html();
std::string_view serve_page_css();
std::string_view serve_page_js();

}  // namespace qkv::cli
