package load

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// BenchmarkReadStream measures the client-side cost of one 256-token chat
// stream in vLLM's chunk shape, which bounds how many tokens per second one
// loadgen process can account for.
func BenchmarkReadStream(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
	for range 256 {
		sb.WriteString("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n")
	}
	sb.WriteString("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":256}}\n\ndata: [DONE]\n\n")
	stream := []byte(sb.String())
	ctx := context.Background()
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		var res Result
		readStream(ctx, ctx, bytes.NewReader(stream), time.Now(), &res)
		if res.Class != ClassOK || res.Tokens != 256 {
			b.Fatalf("result %+v", res)
		}
	}
}
