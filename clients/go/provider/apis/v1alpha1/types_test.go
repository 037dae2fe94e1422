package v1alpha1

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The CRD is generated from manifests/schema.yaml (scripts/gen-manifests.py).
var crdFile = filepath.Join("..", "..", "..", "..", "..", "manifests", "crd", "filteredapiexportendpointslices.yaml")

// TestTypesMatchTheCRD walks the CRD's openAPIV3Schema and the Go types together: every schema
// property is a Go field of a fitting kind and vice versa (kcp prunes fields the schema lacks,
// so a Go-only field would silently never arrive), and a required property is never omitempty.
func TestTypesMatchTheCRD(t *testing.T) {
	raw, err := os.ReadFile(crdFile)
	if err != nil {
		t.Fatal(err)
	}
	type version struct {
		Name   string `json:"name"`
		Schema struct {
			OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
		} `json:"schema"`
	}
	var crd struct {
		Spec struct {
			Group    string `json:"group"`
			Names    struct{ Kind, Plural string }
			Versions []version `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &crd); err != nil {
		t.Fatal(err)
	}
	if crd.Spec.Group != GroupName || crd.Spec.Names.Plural != Resource || crd.Spec.Names.Kind != "FilteredAPIExportEndpointSlice" {
		t.Fatalf("CRD names %s %s.%s, types %s.%s", crd.Spec.Names.Kind, crd.Spec.Names.Plural, crd.Spec.Group, Resource, GroupName)
	}
	i := slices.IndexFunc(crd.Spec.Versions, func(v version) bool { return v.Name == SchemeGroupVersion.Version })
	if i < 0 {
		t.Fatalf("CRD has no version %s", SchemeGroupVersion.Version)
	}
	compare(t, "FilteredAPIExportEndpointSlice", crd.Spec.Versions[i].Schema.OpenAPIV3Schema, reflect.TypeOf(FilteredAPIExportEndpointSlice{}))
}

type jsonField struct {
	typ       reflect.Type
	omitempty bool
}

// jsonFields lists a struct's JSON fields, inlined embedded structs included.
func jsonFields(t reflect.Type) map[string]jsonField {
	fields := map[string]jsonField{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if f.Anonymous && name == "" {
			for k, v := range jsonFields(f.Type) {
				fields[k] = v
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		fields[name] = jsonField{typ: f.Type, omitempty: strings.Contains(","+opts+",", ",omitempty,")}
	}
	return fields
}

var jsonMarshaler = reflect.TypeOf((*json.Marshaler)(nil)).Elem()

func compare(t *testing.T, path string, schema map[string]any, typ reflect.Type) {
	t.Helper()
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	kind, _ := schema["type"].(string)
	switch kind {
	case "string":
		if typ.Kind() != reflect.String && !reflect.PointerTo(typ).Implements(jsonMarshaler) {
			t.Errorf("%s: schema string, Go %s", path, typ)
		}
	case "integer":
		switch typ.Kind() {
		case reflect.Int, reflect.Int32, reflect.Int64:
		default:
			t.Errorf("%s: schema integer, Go %s", path, typ)
		}
	case "array":
		if typ.Kind() != reflect.Slice {
			t.Errorf("%s: schema array, Go %s", path, typ)
			return
		}
		items, _ := schema["items"].(map[string]any)
		compare(t, path+"[]", items, typ.Elem())
	case "object":
		props, hasProps := schema["properties"].(map[string]any)
		if additional, ok := schema["additionalProperties"].(map[string]any); ok {
			if typ.Kind() != reflect.Map {
				t.Errorf("%s: schema map, Go %s", path, typ)
				return
			}
			compare(t, path+"{}", additional, typ.Elem())
			return
		}
		if typ.Kind() != reflect.Struct {
			t.Errorf("%s: schema object, Go %s", path, typ)
			return
		}
		if !hasProps { // e.g. metadata: the apiserver's own
			return
		}
		fields := jsonFields(typ)
		var required []string
		for _, r := range asSlice(schema["required"]) {
			required = append(required, r.(string))
		}
		for name, sub := range props {
			f, ok := fields[name]
			if !ok {
				t.Errorf("%s.%s: in the schema, not in %s", path, name, typ)
				continue
			}
			if slices.Contains(required, name) && f.omitempty {
				t.Errorf("%s.%s: required in the schema, omitempty in Go", path, name)
			}
			compare(t, path+"."+name, sub.(map[string]any), f.typ)
		}
		for name := range fields {
			if _, ok := props[name]; !ok {
				t.Errorf("%s.%s: in %s, not in the schema (kcp would prune it)", path, name, typ)
			}
		}
	default:
		t.Errorf("%s: schema type %q not handled", path, kind)
	}
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}

// A slice as vwserver's controller writes it (kubectl get -o json).
const sliceJSON = `{
  "apiVersion": "sync.edge-connect.eu/v1alpha1",
  "kind": "FilteredAPIExportEndpointSlice",
  "metadata": {"name": "prod-widgets", "annotations": {"kcp.io/cluster": "2fx3m0rnxzbs8mq9"}},
  "spec": {
    "export": {"path": "root:provider", "name": "widgets.example.io"},
    "objectSelector": {"matchLabels": {"env": "prod"},
                       "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]}
  },
  "status": {
    "observedGeneration": 1,
    "endpoints": [{"url": "https://vwserver.example.com/services/filtered-apiexport/2fx3m0rnxzbs8mq9/prod-widgets"},
                  {"url": ""}],
    "conditions": [{"type": "Ready", "status": "True", "observedGeneration": 1,
                    "lastTransitionTime": "2026-01-02T03:04:05Z", "reason": "Ready", "message": "serving"}]
  }
}`

func TestDecodeAndDeepCopy(t *testing.T) {
	var s FilteredAPIExportEndpointSlice
	if err := json.Unmarshal([]byte(sliceJSON), &s); err != nil {
		t.Fatal(err)
	}
	if got := s.URLs(); !slices.Equal(got, []string{"https://vwserver.example.com/services/filtered-apiexport/2fx3m0rnxzbs8mq9/prod-widgets"}) {
		t.Fatalf("URLs() = %v", got)
	}
	if s.Spec.Export.Path != "root:provider" || s.Spec.ObjectSelector.MatchExpressions[0].Operator != metav1.LabelSelectorOpIn {
		t.Fatalf("spec: %+v", s.Spec)
	}
	if c := s.Status.Conditions[0]; c.Type != ConditionReady || c.Status != metav1.ConditionTrue || c.LastTransitionTime.Year() != 2026 {
		t.Fatalf("condition: %+v", c)
	}

	c := s.DeepCopy()
	if !reflect.DeepEqual(c, &s) {
		t.Fatal("DeepCopy differs from the original")
	}
	c.Annotations["kcp.io/cluster"] = "x"
	c.Spec.ObjectSelector.MatchLabels["env"] = "dev"
	c.Spec.ObjectSelector.MatchExpressions[0].Values[0] = "z"
	c.Status.Endpoints[0].URL = "changed"
	c.Status.Conditions[0].LastTransitionTime.Time = c.Status.Conditions[0].LastTransitionTime.AddDate(1, 0, 0)
	c.Status.Conditions[0].Message = "changed"
	if s.Annotations["kcp.io/cluster"] != "2fx3m0rnxzbs8mq9" || s.Spec.ObjectSelector.MatchLabels["env"] != "prod" ||
		s.Spec.ObjectSelector.MatchExpressions[0].Values[0] != "a" || s.Status.Endpoints[0].URL == "changed" ||
		s.Status.Conditions[0].LastTransitionTime.Year() != 2026 || s.Status.Conditions[0].Message != "serving" {
		t.Fatalf("changing the copy changed the original: %+v", s)
	}

	list := &FilteredAPIExportEndpointSliceList{Items: []FilteredAPIExportEndpointSlice{s}}
	lc := list.DeepCopyObject().(*FilteredAPIExportEndpointSliceList)
	lc.Items[0].Status.Endpoints[0].URL = "changed"
	if list.Items[0].Status.Endpoints[0].URL == "changed" {
		t.Fatal("list copy shares items")
	}
	var nilSlice *FilteredAPIExportEndpointSlice
	if nilSlice.DeepCopy() != nil || nilSlice.DeepCopyObject() != nil {
		t.Fatal("a nil slice copies to non-nil")
	}
}
