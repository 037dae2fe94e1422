// Package v1alpha1 holds Go types for vwserver's API, sync.edge-connect.eu/v1alpha1
// FilteredAPIExportEndpointSlice (manifests/schema.yaml; manifests/crd/ renders it as a CRD and
// manifests/kcp/ as an APIResourceSchema + APIExport). They are written by hand, like their
// DeepCopy functions (zz_deepcopy.go); types_test.go checks every JSON field against the CRD.
//
// A slice is cluster-scoped and lives in a kcp workspace that binds vwserver's export. Its spec
// names an APIExport and a label selector; vwserver's controller writes status.endpoints[].url,
// the filtered virtual-workspace URLs a provider points its clients (or multicluster-runtime,
// see package filteredapiexport) at.
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FilteredAPIExportEndpointSlice is a filtered view of one APIExport's virtual workspace: only
// objects whose labels match spec.objectSelector are visible and writable through
// status.endpoints[].url.
type FilteredAPIExportEndpointSlice struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   FilteredAPIExportEndpointSliceSpec   `json:"spec"`
	Status FilteredAPIExportEndpointSliceStatus `json:"status,omitempty"`
}

// FilteredAPIExportEndpointSliceSpec says which APIExport to filter and which of its objects to
// show. It is immutable.
type FilteredAPIExportEndpointSliceSpec struct {
	// Export is the APIExport to filter.
	Export ExportReference `json:"export"`
	// ObjectSelector is a standard label selector (matchLabels, matchExpressions). vwserver
	// refuses an empty one (it would expose the whole export).
	ObjectSelector *metav1.LabelSelector `json:"objectSelector,omitempty"`
	// HoldTimeoutSeconds bounds how long the slice may hold an object that is leaving it (a
	// finalizer added through the slice is still on it while its labels no longer match)
	// before vwserver removes the slice's finalizers. Unset: 3600 (one hour); every hold is
	// bounded, at most 604800 (a week).
	HoldTimeoutSeconds *int64 `json:"holdTimeoutSeconds,omitempty"`
	// RelatedResources says which objects of the export's permission claims (core secrets,
	// configmaps, ...) are visible through the slice: a claimed object is visible iff one of
	// these rules matches it; with no rule for a claimed resource none of its objects is.
	RelatedResources []RelatedResource `json:"relatedResources,omitempty"`
}

// RelatedResource is one rule for a claimed resource: exactly one of Selector and
// ReferencedBy.
type RelatedResource struct {
	// Group of the claimed resource; empty for the core group.
	Group string `json:"group,omitempty"`
	// Resource is the claimed resource's plural name (secrets, configmaps).
	Resource string `json:"resource"`
	// Selector: the claimed objects whose labels match it are visible (non-empty).
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
	// ReferencedBy: the claimed objects that objects visible through the slice name, in the
	// same logical cluster and namespace, are visible while they are named.
	ReferencedBy *RelatedReference `json:"referencedBy,omitempty"`
}

// RelatedReference is where referencing objects name claimed objects.
type RelatedReference struct {
	// Path: field names separated by dots, [*] after a list field for every element
	// (spec.users[*].passwordSecretRef.name). Strings found there are names.
	Path string `json:"path"`
	// Group, Version and Resource name the referencing resource of the export; only its
	// objects visible through the slice reference. The references are read at Version.
	Group    string `json:"group,omitempty"`
	Version  string `json:"version"`
	Resource string `json:"resource"`
}

// ExportReference names an APIExport.
type ExportReference struct {
	// Path is the workspace path (root:my-org) or logical-cluster ID of the APIExport's
	// workspace; empty means the slice's own workspace.
	Path string `json:"path,omitempty"`
	// Name is the APIExport's name.
	Name string `json:"name"`
}

// FilteredAPIExportEndpointSliceStatus is written by vwserver's controller.
type FilteredAPIExportEndpointSliceStatus struct {
	// ObservedGeneration is the spec generation the status describes.
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Endpoints are the URLs of the filtered virtual workspace, one per upstream shard. A
	// client appends /clusters/<logical cluster | *>/<API path>.
	Endpoints []FilteredAPIExportEndpoint `json:"endpoints,omitempty"`
	// Conditions: SelectorValid, APIExportValid, Ready.
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// FilteredAPIExportEndpoint is one URL of a slice.
type FilteredAPIExportEndpoint struct {
	URL string `json:"url"`
}

// FilteredAPIExportEndpointSliceList is a list of slices.
type FilteredAPIExportEndpointSliceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	Items []FilteredAPIExportEndpointSlice `json:"items"`
}

// Condition types vwserver writes.
const (
	ConditionSelectorValid  = "SelectorValid"
	ConditionAPIExportValid = "APIExportValid"
	ConditionReady          = "Ready"
	// ConditionRelatedResourcesValid is written only for a slice with spec.relatedResources.
	ConditionRelatedResourcesValid = "RelatedResourcesValid"
)

// URLs returns the slice's endpoint URLs, in status order, without empty ones.
func (s *FilteredAPIExportEndpointSlice) URLs() []string {
	urls := make([]string, 0, len(s.Status.Endpoints))
	for _, ep := range s.Status.Endpoints {
		if ep.URL != "" {
			urls = append(urls, ep.URL)
		}
	}
	return urls
}
