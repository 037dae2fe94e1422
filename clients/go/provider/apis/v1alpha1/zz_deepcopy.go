package v1alpha1

// DeepCopy functions, written by hand in the shape controller-gen generates.

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// DeepCopyInto copies the receiver into out.
func (in *FilteredAPIExportEndpointSlice) DeepCopyInto(out *FilteredAPIExportEndpointSlice) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	in.Spec.DeepCopyInto(&out.Spec)
	in.Status.DeepCopyInto(&out.Status)
}

// DeepCopy returns a deep copy of the receiver.
func (in *FilteredAPIExportEndpointSlice) DeepCopy() *FilteredAPIExportEndpointSlice {
	if in == nil {
		return nil
	}
	out := new(FilteredAPIExportEndpointSlice)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *FilteredAPIExportEndpointSlice) DeepCopyObject() runtime.Object {
	if c := in.DeepCopy(); c != nil {
		return c
	}
	return nil
}

// DeepCopyInto copies the receiver into out.
func (in *FilteredAPIExportEndpointSliceSpec) DeepCopyInto(out *FilteredAPIExportEndpointSliceSpec) {
	*out = *in
	out.Export = in.Export
	if in.ObjectSelector != nil {
		out.ObjectSelector = new(metav1.LabelSelector)
		in.ObjectSelector.DeepCopyInto(out.ObjectSelector)
	}
	if in.HoldTimeoutSeconds != nil {
		out.HoldTimeoutSeconds = new(int64)
		*out.HoldTimeoutSeconds = *in.HoldTimeoutSeconds
	}
	if in.RelatedResources != nil {
		out.RelatedResources = make([]RelatedResource, len(in.RelatedResources))
		for i := range in.RelatedResources {
			in.RelatedResources[i].DeepCopyInto(&out.RelatedResources[i])
		}
	}
}

// DeepCopyInto copies the receiver into out.
func (in *RelatedResource) DeepCopyInto(out *RelatedResource) {
	*out = *in
	if in.Selector != nil {
		out.Selector = new(metav1.LabelSelector)
		in.Selector.DeepCopyInto(out.Selector)
	}
	if in.ReferencedBy != nil {
		out.ReferencedBy = new(RelatedReference)
		*out.ReferencedBy = *in.ReferencedBy
	}
}

// DeepCopy returns a deep copy of the receiver.
func (in *RelatedResource) DeepCopy() *RelatedResource {
	if in == nil {
		return nil
	}
	out := new(RelatedResource)
	in.DeepCopyInto(out)
	return out
}

// DeepCopy returns a deep copy of the receiver.
func (in *FilteredAPIExportEndpointSliceSpec) DeepCopy() *FilteredAPIExportEndpointSliceSpec {
	if in == nil {
		return nil
	}
	out := new(FilteredAPIExportEndpointSliceSpec)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyInto copies the receiver into out.
func (in *ExportReference) DeepCopyInto(out *ExportReference) {
	*out = *in
}

// DeepCopy returns a deep copy of the receiver.
func (in *ExportReference) DeepCopy() *ExportReference {
	if in == nil {
		return nil
	}
	out := new(ExportReference)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyInto copies the receiver into out.
func (in *FilteredAPIExportEndpointSliceStatus) DeepCopyInto(out *FilteredAPIExportEndpointSliceStatus) {
	*out = *in
	if in.Endpoints != nil {
		out.Endpoints = make([]FilteredAPIExportEndpoint, len(in.Endpoints))
		copy(out.Endpoints, in.Endpoints)
	}
	if in.Conditions != nil {
		out.Conditions = make([]metav1.Condition, len(in.Conditions))
		for i := range in.Conditions {
			in.Conditions[i].DeepCopyInto(&out.Conditions[i])
		}
	}
}

// DeepCopy returns a deep copy of the receiver.
func (in *FilteredAPIExportEndpointSliceStatus) DeepCopy() *FilteredAPIExportEndpointSliceStatus {
	if in == nil {
		return nil
	}
	out := new(FilteredAPIExportEndpointSliceStatus)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyInto copies the receiver into out.
func (in *FilteredAPIExportEndpoint) DeepCopyInto(out *FilteredAPIExportEndpoint) {
	*out = *in
}

// DeepCopy returns a deep copy of the receiver.
func (in *FilteredAPIExportEndpoint) DeepCopy() *FilteredAPIExportEndpoint {
	if in == nil {
		return nil
	}
	out := new(FilteredAPIExportEndpoint)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyInto copies the receiver into out.
func (in *FilteredAPIExportEndpointSliceList) DeepCopyInto(out *FilteredAPIExportEndpointSliceList) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]FilteredAPIExportEndpointSlice, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
}

// DeepCopy returns a deep copy of the receiver.
func (in *FilteredAPIExportEndpointSliceList) DeepCopy() *FilteredAPIExportEndpointSliceList {
	if in == nil {
		return nil
	}
	out := new(FilteredAPIExportEndpointSliceList)
	in.DeepCopyInto(out)
	return out
}

// DeepCopyObject implements runtime.Object.
func (in *FilteredAPIExportEndpointSliceList) DeepCopyObject() runtime.Object {
	if c := in.DeepCopy(); c != nil {
		return c
	}
	return nil
}
