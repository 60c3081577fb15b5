package predicted

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	k8stypes "k8s.io/apimachinery/pkg/types"
	fwkplugin "sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/plugin"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/requestcontrol"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/interface/scheduling"
	"sigs.k8s.io/gateway-api-inference-extension/pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix"
)

// What the plugin costs per request (predicted-alone: its PrepareData and PreRequest on a
// request the producer hashed once, a repeated prompt), beside the work of GIE's prefix producer on
// the same request (its hashing, index lookup and update), in one run: `go test -bench . ./plugins/predicted/`.
// Prompts of 1 KiB and 32 KiB, a shared prefix, 4 pods, GIE's default 16-token blocks.
func BenchmarkPerRequest(b *testing.B) {
	for _, size := range []int{1 << 10, 32 << 10} {
		ctx := context.Background()
		handle := fwkplugin.NewEppHandle(ctx, func() []k8stypes.NamespacedName { return nil })
		producer, err := approximateprefix.ApproxPrefixCacheFactory("p",
			json.RawMessage(`{"blockSizeTokens":16,"maxPrefixBlocksToMatch":4096,"lruCapacityPerServer":31250}`), handle)
		if err != nil {
			b.Fatal(err)
		}
		handle.AddPlugin("p", producer)
		prep := producer.(requestcontrol.PrepareDataPlugin)
		pre := producer.(requestcontrol.PreRequest)
		ours := plugin(b, handle, DefaultStrideBlocks)
		prompt := strings.Repeat("system prompt shared by every request. ", size/40)
		request := func(i int) (*scheduling.LLMRequest, []scheduling.Endpoint) {
			return &scheduling.LLMRequest{
				RequestId: fmt.Sprint(i), TargetModel: "m", Headers: map[string]string{},
				Body: &scheduling.LLMRequestBody{Completions: &scheduling.CompletionsRequest{Prompt: scheduling.Prompt{Raw: prompt + fmt.Sprint(i)}}},
			}, []scheduling.Endpoint{endpoint("a", nil), endpoint("b", nil), endpoint("c", nil), endpoint("d", nil)}
		}
		b.Run(fmt.Sprintf("producer/%dKiB", size>>10), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				req, pods := request(i)
				_ = prep.PrepareRequestData(ctx, req, pods)
				pre.PreRequest(ctx, req, result(pods[0]))
			}
		})
		b.Run(fmt.Sprintf("predicted-alone/%dKiB", size>>10), func(b *testing.B) {
			req, pods := request(-1) // hashed once by the producer; measured as a repeat
			_ = prep.PrepareRequestData(ctx, req, pods)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				_ = ours.PrepareRequestData(ctx, req, pods)
				ours.PreRequest(ctx, req, result(pods[0]))
			}
		})
	}
}
