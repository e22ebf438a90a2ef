// Command upstream is the benchmark's instant OpenAI-compatible upstream.
//
// It answers POST .../chat/completions at once, non-streamed (one JSON object)
// or streamed (SSE chunks ending with "data: [DONE]", plus a usage chunk when
// stream_options.include_usage is true).  It must be much faster than what the
// benchmark measures (~0.1 ms per request), so it never decodes the 40-60 KB
// request: a top-level scan skips strings with IndexByte and reads only the
// "stream" and "stream_options" members.
//
//	upstream -port 8080
//
// Routes: POST */chat/completions, GET /health, GET */models; anything else 404.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const model = "hermes-bench-model"

var (
	bufPool = sync.Pool{New: func() any { return bytes.NewBuffer(make([]byte, 0, 96<<10)) }}
	seq     atomic.Uint64
	// Pieces of the streamed answer; each becomes one SSE event, flushed on its own
	// as a real engine would send it.
	pieces = []string{"Done", " — the", " config", " is", " fixed", " and", " the", " tests", " pass", "."}
)

func main() {
	port := flag.Int("port", 0, "port to listen on (127.0.0.1)")
	flag.Parse()
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", *port))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Fprintf(os.Stdout, "listening on %s\n", ln.Addr())
	srv := &http.Server{Handler: http.HandlerFunc(handle), ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.Serve(ln))
}

func handle(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/chat/completions"):
		chat(w, r)
	case r.Method == http.MethodGet && r.URL.Path == "/health":
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"status":"ok"}`)
	case r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/models"):
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"list","data":[{"id":"`+model+`","object":"model","owned_by":"bench"}]}`)
	default:
		http.NotFound(w, r)
	}
}

func chat(w http.ResponseWriter, r *http.Request) {
	buf := bufPool.Get().(*bytes.Buffer)
	defer bufPool.Put(buf)
	buf.Reset()
	if _, err := buf.ReadFrom(r.Body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	body := buf.Bytes()
	stream, usage, ok := scanTop(body)
	if !ok {
		http.Error(w, `{"error":{"message":"request body is not a JSON object"}}`, http.StatusBadRequest)
		return
	}
	id := "chatcmpl-" + strconv.FormatUint(seq.Add(1), 10)
	created := strconv.FormatInt(time.Now().Unix(), 10)
	prompt := len(body) / 4
	if !stream {
		out := make([]byte, 0, 512)
		out = append(out, `{"id":"`+id+`","object":"chat.completion","created":`+created+`,"model":"`+model+`",`...)
		out = append(out, `"choices":[{"index":0,"message":{"role":"assistant","content":"`...)
		out = append(out, strings.Join(pieces, "")...)
		out = append(out, `"},"finish_reason":"stop"}],`...)
		out = appendUsage(out, prompt)
		out = append(out, '}')
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(out)))
		w.Write(out)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	flusher, _ := w.(http.Flusher)
	head := `data: {"id":"` + id + `","object":"chat.completion.chunk","created":` + created + `,"model":"` + model + `",`
	send := func(rest string) {
		io.WriteString(w, head+rest+"}\n\n")
		if flusher != nil {
			flusher.Flush()
		}
	}
	send(`"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]`)
	for _, p := range pieces {
		send(`"choices":[{"index":0,"delta":{"content":"` + p + `"},"finish_reason":null}]`)
	}
	send(`"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]`)
	if usage {
		send(string(appendUsage([]byte(`"choices":[],`), prompt)))
	}
	io.WriteString(w, "data: [DONE]\n\n")
}

func appendUsage(out []byte, prompt int) []byte {
	completion := len(pieces)
	out = append(out, `"usage":{"prompt_tokens":`...)
	out = strconv.AppendInt(out, int64(prompt), 10)
	out = append(out, `,"completion_tokens":`...)
	out = strconv.AppendInt(out, int64(completion), 10)
	out = append(out, `,"total_tokens":`...)
	out = strconv.AppendInt(out, int64(prompt+completion), 10)
	out = append(out, `,"prompt_tokens_details":{"cached_tokens":0}}`...)
	return out
}

// scanTop reads the top-level "stream" and "stream_options.include_usage"
// members of a JSON object without decoding the rest.
func scanTop(b []byte) (stream, usage, ok bool) {
	i := ws(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false, false, false
	}
	i++
	for {
		i = ws(b, i)
		if i >= len(b) {
			return stream, usage, false
		}
		if b[i] == '}' {
			return stream, usage, true
		}
		if b[i] == ',' {
			i++
			continue
		}
		if b[i] != '"' {
			return stream, usage, false
		}
		end := skipString(b, i)
		if end < 0 {
			return stream, usage, false
		}
		key := b[i+1 : end-1]
		i = ws(b, end)
		if i >= len(b) || b[i] != ':' {
			return stream, usage, false
		}
		i = ws(b, i+1)
		vend := skipValue(b, i)
		if vend < 0 {
			return stream, usage, false
		}
		switch string(key) {
		case "stream":
			stream = bytes.Equal(b[i:vend], []byte("true"))
		case "stream_options":
			usage = hasTrue(b[i:vend], "include_usage")
		}
		i = vend
	}
}

func ws(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t') {
		i++
	}
	return i
}

// skipString returns the index just past the string that starts at b[i] == '"'.
func skipString(b []byte, i int) int {
	j := i + 1
	for {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return -1
		}
		j += k
		n := 0
		for p := j - 1; p > i && b[p] == '\\'; p-- {
			n++
		}
		j++
		if n%2 == 0 {
			return j
		}
	}
}

func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				if i < 0 {
					return -1
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return -1
	default:
		for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\n' {
			i++
		}
		return i
	}
}

// hasTrue reports whether the object text obj has member key equal to true.
func hasTrue(obj []byte, key string) bool {
	k := bytes.Index(obj, []byte(`"`+key+`"`))
	if k < 0 {
		return false
	}
	j := ws(obj, k+len(key)+2)
	if j >= len(obj) || obj[j] != ':' {
		return false
	}
	j = ws(obj, j+1)
	return bytes.HasPrefix(obj[j:], []byte("true"))
}
