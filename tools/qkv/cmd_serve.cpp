// `qkv serve`: the live explorer. A local web server (cpp-httplib, its thread pool serving
// requests concurrently) with one page and a small JSON API (serve/serve_api.h) backed by the
// same functions as `qkv explain` and `qkv compare`. Bound to 127.0.0.1 unless --host says
// otherwise; SIGINT and SIGTERM stop it cleanly (exit 0).
#include <netdb.h>
#include <pthread.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "commands.h"
#include "qkv/error.h"
#include "serve/serve_api.h"
#include "serve/serve_assets.h"

namespace qkv::cli {
namespace {

struct ServeArgs {
  SentenceArgs sentence_args;
  std::string host = "127.0.0.1";
  int port = 8000;
};

std::string error_json(const std::string& message) {
  return nlohmann::json{{"error", message}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void set_json(httplib::Response& res, int status, const std::string& body) {
  res.status = status;
  res.set_content(body, "application/json; charset=utf-8");
}

// POST handlers: the API's answer, or 400 with the reason.
httplib::Server::Handler api(const ServeApi& state, std::string (ServeApi::*call)(const std::string&) const) {
  return [&state, call](const httplib::Request& req, httplib::Response& res) {
    try {
      set_json(res, 200, (state.*call)(req.body));
    } catch (const BadRequest& e) {
      set_json(res, 400, error_json(e.what()));
    }
  };
}

void send(httplib::Response& res, std::string_view text, const char* type) {
  res.set_content(text.data(), text.size(), type);
}

void add_routes(httplib::Server& server, const ServeApi& state) {
  server.Get("/", [](const httplib::Request&, httplib::Response& res) {
    send(res, serve_page_html(), "text/html; charset=utf-8");
  });
  server.Get("/serve.css", [](const httplib::Request&, httplib::Response& res) {
    send(res, serve_page_css(), "text/css; charset=utf-8");
  });
  server.Get("/serve.js", [](const httplib::Request&, httplib::Response& res) {
    send(res, serve_page_js(), "text/javascript; charset=utf-8");
  });
  server.Get("/api/config",
             [&state](const httplib::Request&, httplib::Response& res) { set_json(res, 200, state.config_json()); });
  server.Post("/api/explain", api(state, &ServeApi::explain_json));
  server.Post("/api/compare", api(state, &ServeApi::compare_json));
  // Every refusal is JSON with a message the page can show: unknown routes (404), bodies beyond
  // the limit (413, refused by cpp-httplib before reading them), failures (500).
  server.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        std::string message;
        if (res.status == 404)
          message = fmt::format("unknown route {} {}", req.method, req.path);
        else if (res.status == 413)
          message = fmt::format("the request is larger than the {} bytes the explorer takes", kServeMaxBodyBytes);
        else
          message = fmt::format("HTTP {}", res.status);
        set_json(res, res.status, error_json(message));
        return httplib::Server::HandlerResponse::Handled;
      }));
  server.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string message = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      message = e.what();
    } catch (...) {
    }
    set_json(res, 500, error_json(message));
  });
  server.set_payload_max_length(kServeMaxBodyBytes);
  // cpp-httplib holds a chunked body to that limit only through Content-Length, which such a body
  // lacks (60 MB were read whole). Every client of the explorer sends Content-Length, so a body
  // without one is refused before it is read (the pre-routing handler runs first).
  server.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!req.has_header("Transfer-Encoding")) return httplib::Server::HandlerResponse::Unhandled;
    res.set_header("Connection", "close");  // the unread body must not be taken for the next request
    set_json(res, 411,
             error_json(fmt::format("a request body must come with Content-Length (at most {} bytes), not "
                                    "Transfer-Encoding",
                                    kServeMaxBodyBytes)));
    return httplib::Server::HandlerResponse::Handled;
  });
  // A slow or idle client must not hold one of the pool's threads for long; an idle keep-alive
  // connection also delays stopping by up to its timeout (cpp-httplib waits it out).
  server.set_read_timeout(5);
  server.set_keep_alive_timeout(2);
  server.set_default_headers({{"Cache-Control", "no-store"}, {"X-Content-Type-Options", "nosniff"}});
}

bool loopback(const std::string& host) { return host == "127.0.0.1" || host == "localhost" || host == "::1"; }

const char* signal_name(int sig) { return sig == SIGINT ? "SIGINT" : "SIGTERM"; }

// Takes SIGINT and SIGTERM for the whole run: they are blocked in every thread (threads started
// later, the server's pool and OpenMP's, inherit the mask) and received by one thread with
// sigwait, which stops the server from outside any signal handler.
class StopSignals {
 public:
  StopSignals() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
    waiter_ = std::thread([this] {
      int sig = 0;
      sigwait(&set_, &sig);
      if (finished_) return;  // woken by the destructor
      received_ = sig;
      // stop() does nothing before the server listens: repeat until the run is over. stop() then
      // waits for the pool's requests, and a client that sends a byte now and then never lets its
      // read time out: after kStopGrace the process ends without them.
      const auto deadline = std::chrono::steady_clock::now() + kStopGrace;
      while (!finished_) {
        {
          const std::lock_guard<std::mutex> lock(mutex_);
          if (server_ != nullptr) server_->stop();
        }
        if (std::chrono::steady_clock::now() > deadline) {
          print_to_stderr(
              fmt::format("qkv serve: stopped ({}), leaving requests still being sent unanswered\n", signal_name(sig)));
          std::fflush(nullptr);
          std::_Exit(0);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  }
  ~StopSignals() {
    finished_ = true;
    if (received_ == 0) pthread_kill(waiter_.native_handle(), SIGTERM);
    waiter_.join();
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The server to stop (nullptr: none; after watch(nullptr) returns, it is no longer touched).
  void watch(httplib::Server* server) {
    const std::lock_guard<std::mutex> lock(mutex_);
    server_ = server;
  }
  int received() const { return received_; }

 private:
  static constexpr std::chrono::seconds kStopGrace{5};
  sigset_t set_;
  std::atomic<bool> finished_{false};
  std::atomic<int> received_{0};
  std::mutex mutex_;
  httplib::Server* server_ = nullptr;
  std::thread waiter_;
};

// cpp-httplib reports every failure to bind as one `false`, which read as a port in use when the
// host name did not resolve at all: the name is looked up first, as cpp-httplib then looks it up.
void check_host_resolves(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rc != 0)
    throw Error(
        fmt::format("--host {}: cannot resolve the host name ({}): give an address of this machine, such as "
                    "127.0.0.1",
                    host, ::gai_strerror(rc)));
  ::freeaddrinfo(found);
}

int stopped(int sig) {
  print_to_stderr(fmt::format("qkv serve: stopped ({})\n", signal_name(sig)));
  return 0;
}

int run_serve(const ServeArgs& a) {
  std::signal(SIGPIPE, SIG_IGN);
  check_host_resolves(a.host);  // before the word vectors are read
  StopSignals signals;
  const ServeApi state(a.sentence_args);
  if (signals.received() != 0) return stopped(signals.received());

  httplib::Server server;
  add_routes(server, state);
  // cpp-httplib's default options set SO_REUSEPORT, which lets a second server share a port that
  // is in use (each getting some of the connections): SO_REUSEADDR only, so that fails instead.
  int listening = -1;
  server.set_socket_options([&listening](int sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    listening = sock;
  });
  const int port = a.port == 0 ? server.bind_to_any_port(a.host) : (server.bind_to_port(a.host, a.port) ? a.port : -1);
  // cpp-httplib listens with a backlog of 5: more clients connecting at once had their requests
  // dropped and retransmitted late, after the server gave up waiting. listen() again raises it.
  if (port >= 0 && listening >= 0) ::listen(listening, SOMAXCONN);
  if (port < 0)
    throw Error(
        fmt::format("--host {} --port {}: cannot listen there (the port is in use, or the address is not "
                    "one of this machine's)",
                    a.host, a.port));
  if (!loopback(a.host))
    print_to_stderr(fmt::format(
        "qkv serve: warning: listening on {}, not only on this machine: anyone who can reach port {} can use "
        "the explorer\n",
        a.host, port));
  const std::string url_host = a.host.find(':') != std::string::npos ? "[" + a.host + "]" : a.host;
  fmt::print("qkv serve: http://{}:{}/  (Ctrl-C stops)\n", url_host, port);
  std::fflush(stdout);
  signals.watch(&server);
  const bool ok = server.listen_after_bind();
  signals.watch(nullptr);
  if (signals.received() != 0) return stopped(signals.received());
  if (!ok) throw Error("the server stopped: it could not accept connections");
  return 0;
}

}  // namespace

Command add_serve(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* sub = app.add_subcommand(
      "serve",
      "The live explorer: a local web page where you type a sentence and watch every step of self-attention,\n"
      "switch layers (the default one, parameter-free, random), toggle √d_k scaling, positions and the causal\n"
      "mask, and compare one word in two sentences. Prints the URL; Ctrl-C stops.");
  sub->add_option("--port", args->port, "TCP port (default 8000; 0: any free port, printed)")
      ->check(integer_in(0, 65535));
  sub->add_option("--host", args->host,
                  "Address to listen on (default 127.0.0.1, this machine only; 0.0.0.0 opens it to the network)")
      ->check(CLI::Validator(
          [](std::string& host) { return host.empty() ? std::string("an empty address (write 127.0.0.1)") : ""; },
          "ADDRESS", ""));
  add_sentence_options(sub, args->sentence_args, /*embeddings_required=*/true);
  return {sub, [args] { return run_serve(*args); }};
}

}  // namespace qkv::cli
