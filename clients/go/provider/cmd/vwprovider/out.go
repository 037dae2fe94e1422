package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
)

// jsonLines writes one JSON object per line, whole lines only, from any goroutine.
type jsonLines struct {
	mu sync.Mutex
	w  io.Writer
}

func newJSONLines(w io.Writer) *jsonLines { return &jsonLines{w: w} }

func (o *jsonLines) emit(v map[string]any) {
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(map[string]any{"event": "error", "error": fmt.Sprintf("encode: %v", err)})
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, err := o.w.Write(append(b, '\n')); err != nil {
		fmt.Fprintf(os.Stderr, "vwprovider: cannot write to stdout: %v\n", err)
	}
}

// requestLogger reports every HTTP request (to kcp and to vwserver): method, URL without the
// query, query, status or transport error — so a test can see where each read and write went.
type requestLogger struct {
	next http.RoundTripper
	out  *jsonLines
}

func (t *requestLogger) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	u := *req.URL
	u.RawQuery = ""
	line := map[string]any{"event": "request", "method": req.Method, "url": u.String(), "query": req.URL.RawQuery}
	if err != nil {
		line["error"] = err.Error()
	} else {
		line["status"] = resp.StatusCode
	}
	t.out.emit(line)
	return resp, err
}
