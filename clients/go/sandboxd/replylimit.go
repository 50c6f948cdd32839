package sandboxd

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// replyField is the request field by which a caller tells the server the largest reply it
// accepts. A server answers at most 4 MiB (gRPC's default receive limit) without it; this
// client receives up to maxMessage, so it says so on every request that has the field (Run,
// ReadFile and every List), unless the caller set it.
const replyField protoreflect.Name = "max_reply_bytes"

func replyLimitInterceptor(limit int64) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(ctx, method, withReplyLimit(req, limit), reply, cc, opts...)
	}
}

// withReplyLimit is req with max_reply_bytes set to limit where it has the field unset (a copy:
// the caller's message is left as it was).
func withReplyLimit(req any, limit int64) any {
	m, ok := req.(proto.Message)
	if !ok {
		return req
	}
	f := m.ProtoReflect().Descriptor().Fields().ByName(replyField)
	if f == nil || f.Kind() != protoreflect.Int64Kind || m.ProtoReflect().Get(f).Int() != 0 {
		return req
	}
	c := proto.Clone(m)
	c.ProtoReflect().Set(f, protoreflect.ValueOfInt64(limit))
	return c
}
