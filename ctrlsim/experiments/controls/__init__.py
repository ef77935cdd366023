"""`ctrlsim controls`: do the controls a box declares do what they claim? (issue 48)"""
