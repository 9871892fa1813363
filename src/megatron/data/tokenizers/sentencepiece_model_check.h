// check_sentencepiece_pieces: what libsentencepiece cannot be trusted with, refused before it sees a model.
//
// The library parses a .model (a serialized ModelProto) safely, but builds its piece trie (Darts) from the
// pieces as they are: a piece that is empty or holds a NUL byte makes Darts throw an exception that ends the
// process (std::terminate, inside the library) instead of returning a status. This walks the protobuf wire
// format far enough to see every piece (ModelProto field 1, repeated SentencePiece; its field 1, the piece
// string) and names the first bad one. Bytes that are not a well-formed message are left to the library,
// which refuses them with its own status.
#pragma once

#include <string>
#include <string_view>

namespace megatron::data {

// Throws megatron::Error naming `path`, the piece's index and its bytes when a piece is empty or holds a NUL.
void check_sentencepiece_pieces(std::string_view model_bytes, const std::string& path);

}  // namespace megatron::data
