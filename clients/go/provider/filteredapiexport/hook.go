package filteredapiexport

import (
	"github.com/go-logr/logr"
)

// watchFailedMessage is what github.com/kcp-dev/multicluster-provider/pkg/provider v0.8.0 logs
// (with key "url") when it cannot start watching an endpoint of the slice — and then never tries
// that endpoint again until the slice object changes. The generic provider offers no other
// signal, so the retry listens for this line; TestHookSeesTheGenericProvidersFailure pins it.
const watchFailedMessage = "failed to watch endpoint"

// hookEndpointFailures returns l with a sink that also calls failed(url, err) for every
// watchFailedMessage error logged through it (or through loggers derived from it).
func hookEndpointFailures(l logr.Logger, failed func(url string, err error)) logr.Logger {
	sink := l.GetSink()
	if sink == nil {
		sink = nopSink{}
	}
	return logr.New(hookSink{LogSink: sink, failed: failed})
}

type hookSink struct {
	logr.LogSink
	failed func(url string, err error)
}

var (
	_ logr.LogSink          = hookSink{}
	_ logr.CallDepthLogSink = hookSink{}
)

func (s hookSink) Init(info logr.RuntimeInfo) {
	info.CallDepth++ // our Error/Info frame
	s.LogSink.Init(info)
}

func (s hookSink) Error(err error, msg string, keysAndValues ...any) {
	if msg == watchFailedMessage {
		for i := 0; i+1 < len(keysAndValues); i += 2 {
			if k, ok := keysAndValues[i].(string); ok && k == "url" {
				if url, ok := keysAndValues[i+1].(string); ok {
					s.failed(url, err)
				}
			}
		}
	}
	s.LogSink.Error(err, msg, keysAndValues...)
}

func (s hookSink) WithValues(keysAndValues ...any) logr.LogSink {
	return hookSink{LogSink: s.LogSink.WithValues(keysAndValues...), failed: s.failed}
}

func (s hookSink) WithName(name string) logr.LogSink {
	return hookSink{LogSink: s.LogSink.WithName(name), failed: s.failed}
}

func (s hookSink) WithCallDepth(depth int) logr.LogSink {
	if d, ok := s.LogSink.(logr.CallDepthLogSink); ok {
		return hookSink{LogSink: d.WithCallDepth(depth), failed: s.failed}
	}
	return s
}

type nopSink struct{}

func (nopSink) Init(logr.RuntimeInfo)            {}
func (nopSink) Enabled(int) bool                 { return false }
func (nopSink) Info(int, string, ...any)         {}
func (nopSink) Error(error, string, ...any)      {}
func (n nopSink) WithValues(...any) logr.LogSink { return n }
func (n nopSink) WithName(string) logr.LogSink   { return n }
