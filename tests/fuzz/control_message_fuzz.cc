// libFuzzer target for the control-message layer (libmalle/control).
//
// Each input is used four ways:
//   1. as a signed wire message, to Verify (random bytes stop at the size or
//      MAC checks; that path must never crash either);
//   2. as envelope JSON (a trailing " <64 hex>" MAC, as in the seed corpus,
//      is cut off first), to DecodeEnvelopeJson, so that the parser and
//      every body decoder are reached; a message that decodes must encode,
//      and decode again to the same value, which encodes to the same bytes;
//   3. the same JSON signed here with the fuzzer's secret, to Verify, which
//      then runs staleness, replay and body checks; a message accepted once
//      must be refused as replayed the second time;
//   4. as a saved ReplayGuard, to ReplayGuard::Load; a guard that loads must
//      save to text that loads to the same state.
// A broken property calls __builtin_trap(), which libFuzzer reports as a crash.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "libmalle/control/wire/envelope.h"
#include "libmalle/control/wire/hmac.h"
#include "libmalle/control/wire/messages.h"
#include "libmalle/control/wire/secret.h"

namespace {

using malle::control::Envelope;

// The seed corpus is signed with this secret at ts 1700000000.x.
constexpr absl::string_view kFuzzSecret = "malle-fuzz-secret-0123456789abcdef";
const absl::Time kNow = absl::FromUnixSeconds(1'700'000'000);

const malle::control::Secret& FuzzSecret() {
  static const auto* secret =
      new malle::control::Secret(*malle::control::Secret::FromBytes(std::string(kFuzzSecret)));
  return *secret;
}

void Require(bool property) {
  if (!property) __builtin_trap();
}

void RoundTrip(absl::string_view json) {
  absl::StatusOr<Envelope> decoded = malle::control::DecodeEnvelopeJson(json);
  if (!decoded.ok()) {
    Require(decoded.status().code() == absl::StatusCode::kInvalidArgument);
    Require(!decoded.status().message().empty());
    return;
  }
  absl::StatusOr<std::string> encoded = malle::control::EncodeEnvelopeJson(*decoded);
  Require(encoded.ok());
  absl::StatusOr<Envelope> again = malle::control::DecodeEnvelopeJson(*encoded);
  Require(again.ok() && *again == *decoded);
  // Beside operator==, byte for byte: what decodes from our own encoding
  // encodes to the same bytes. A field that does not survive encode->decode
  // shows up here even where operator== does not compare it.
  absl::StatusOr<std::string> encoded_again = malle::control::EncodeEnvelopeJson(*again);
  Require(encoded_again.ok() && *encoded_again == *encoded);
  absl::StatusOr<std::string> body = malle::control::EncodeBody(decoded->message);
  Require(body.ok());
  absl::StatusOr<malle::control::Message> body_again =
      malle::control::DecodeBody(malle::control::TypeOf(decoded->message), *body);
  Require(body_again.ok() && *body_again == decoded->message);
  absl::StatusOr<std::string> body_encoded_again = malle::control::EncodeBody(*body_again);
  Require(body_encoded_again.ok() && *body_encoded_again == *body);
}

void SignAndVerify(absl::string_view json) {
  const std::string wire =
      absl::StrCat(json, " ",
                   malle::control::MacToHex(malle::control::HmacSha256(
                       FuzzSecret(), absl::StrCat(malle::control::kMacContext, json))));
  malle::control::ReplayGuardOptions guard_options;
  guard_options.max_senders = 2;
  malle::control::ReplayGuard guard(guard_options);
  malle::control::VerifyOptions options;
  options.max_skew = absl::Hours(24);
  absl::StatusOr<Envelope> first = malle::control::Verify(wire, FuzzSecret(), guard, kNow, options);
  if (!first.ok()) {
    // Authenticated: only the post-MAC rejections are possible.
    const absl::StatusCode code = first.status().code();
    Require(code == absl::StatusCode::kInvalidArgument ||
            code == absl::StatusCode::kFailedPrecondition);
    Require(guard.size() == 0);
    return;
  }
  Require(guard.HighestSeq(first->sender) == first->seq);
  // Verify decodes the same envelope as the unsigned layer.
  absl::StatusOr<Envelope> unsigned_decoded = malle::control::DecodeEnvelopeJson(json);
  Require(unsigned_decoded.ok() && *unsigned_decoded == *first);
  absl::StatusOr<Envelope> second =
      malle::control::Verify(wire, FuzzSecret(), guard, kNow, options);
  Require(second.status().code() == absl::StatusCode::kAlreadyExists);
  // The guard survives a journal round trip and still refuses the replay.
  absl::StatusOr<malle::control::ReplayGuard> loaded =
      malle::control::ReplayGuard::Load(guard.Save(), guard_options);
  Require(loaded.ok());
  Require(malle::control::Verify(wire, FuzzSecret(), *loaded, kNow, options).status().code() ==
          absl::StatusCode::kAlreadyExists);
}

void LoadGuard(absl::string_view text) {
  malle::control::ReplayGuardOptions options;
  options.max_senders = 8;
  absl::StatusOr<malle::control::ReplayGuard> guard =
      malle::control::ReplayGuard::Load(text, options);
  if (!guard.ok()) return;
  const std::string saved = guard->Save();
  absl::StatusOr<malle::control::ReplayGuard> again =
      malle::control::ReplayGuard::Load(saved, options);
  Require(again.ok() && again->Save() == saved);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);

  // 1. Arbitrary bytes off the wire.
  {
    malle::control::ReplayGuard guard;
    absl::StatusOr<Envelope> verified = malle::control::Verify(input, FuzzSecret(), guard, kNow);
    if (verified.ok()) RoundTrip(input.substr(0, input.size() - 65));
  }

  // 2 and 3. The JSON part.
  absl::string_view json = input;
  if (json.size() >= 65 && json[json.size() - 65] == ' ') json.remove_suffix(65);
  RoundTrip(json);
  SignAndVerify(json);

  // 4. A saved replay guard.
  LoadGuard(input);
  return 0;
}
